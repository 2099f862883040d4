//! kubelet's plugin registration as kubelet 1.36 (grpc-go) really sends it: the
//! `:authority` of its calls is the percent-encoded socket path, which h2 alone rejects
//! with RST_STREAM PROTOCOL_ERROR. Every unix socket localvol serves must answer such
//! calls, and calls with the raw path that grpc-python and grpc-java send.
//!
//! The calls are written here as raw HTTP/2 frames, with header blocks encoded as
//! grpc-go encodes them (Huffman-coded, incrementally indexed, so the second call on a
//! connection refers to the first one's `:authority` in the dynamic table): a tonic
//! client cannot send an authority the `http` crate rejects.

use std::path::Path;
use std::time::Duration;

use localvol::proto::csi::v1::GetPluginInfoResponse;
use localvol::proto::identity::GetIdentityResponse;
use localvol::proto::pluginregistration::PluginInfo;
use localvol_testkit::InProcessDaemon;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use localvol_grpc_frames::{
    ACK, CONTINUATION, DATA, END_HEADERS, END_STREAM, GOAWAY, GRPC_GO_AUTHORITY, GrpcGoEncoder, HEADERS,
    RST_STREAM, SETTINGS, frame, grpc_request, preface_and_settings,
};

/// What came back for one call.
#[derive(Debug, Default)]
struct Reply {
    /// Response headers and trailers, in order.
    headers: Vec<(String, String)>,
    /// The gRPC message, without its 5-octet prefix.
    message: Vec<u8>,
    /// The RST_STREAM or GOAWAY error code, if the server gave up on the call.
    reset: Option<u32>,
}

impl Reply {
    fn grpc_status(&self) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == "grpc-status")
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/2 connection to `socket`, speaking like grpc-go.
struct RawClient {
    stream: UnixStream,
    encoder: GrpcGoEncoder,
    decoder: loona_hpack::Decoder<'static>,
    next_stream: u32,
}

impl RawClient {
    async fn connect(socket: &Path) -> Self {
        let mut stream = UnixStream::connect(socket).await.unwrap();
        stream.write_all(&preface_and_settings()).await.unwrap();
        Self {
            stream,
            encoder: GrpcGoEncoder::default(),
            decoder: loona_hpack::Decoder::new(),
            next_stream: 1,
        }
    }

    /// A unary call with an empty request message, answered within ten seconds.
    async fn call(&mut self, authority: &str, path: &str) -> Reply {
        let id = self.next_stream;
        self.next_stream += 2;
        let block = self.encoder.encode(&grpc_request(authority, path));
        let mut request = frame(HEADERS, END_HEADERS, id, &block);
        request.extend(frame(DATA, END_STREAM, id, &[0, 0, 0, 0, 0]));
        self.stream.write_all(&request).await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), self.reply(id))
            .await
            .expect("a reply within 10 s")
    }

    async fn reply(&mut self, id: u32) -> Reply {
        let mut reply = Reply::default();
        let mut block = Vec::new();
        let mut body = Vec::new();
        loop {
            let mut header = [0u8; 9];
            self.stream.read_exact(&mut header).await.unwrap();
            let len = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
            let (kind, flags) = (header[3], header[4]);
            let stream = u32::from_be_bytes(header[5..9].try_into().unwrap()) & 0x7fff_ffff;
            let mut payload = vec![0u8; len];
            self.stream.read_exact(&mut payload).await.unwrap();
            match kind {
                SETTINGS if flags & ACK == 0 => {
                    self.stream
                        .write_all(&frame(SETTINGS, ACK, 0, &[]))
                        .await
                        .unwrap();
                }
                GOAWAY => {
                    reply.reset = Some(u32::from_be_bytes(payload[4..8].try_into().unwrap()));
                    return reply;
                }
                RST_STREAM if stream == id => {
                    reply.reset = Some(u32::from_be_bytes(payload[..4].try_into().unwrap()));
                    return reply;
                }
                HEADERS | CONTINUATION => {
                    // The server's blocks all share the connection's table: decode each.
                    block.extend_from_slice(&payload);
                    if flags & END_HEADERS != 0 {
                        let decoded = self.decoder.decode(&block).unwrap();
                        block.clear();
                        if stream == id {
                            reply.headers.extend(decoded.into_iter().map(|(n, v)| {
                                (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap())
                            }));
                        }
                    }
                }
                DATA if stream == id => body.extend_from_slice(&payload),
                _ => {}
            }
            if stream == id && flags & END_STREAM != 0 && matches!(kind, HEADERS | DATA) {
                break;
            }
        }
        if body.len() >= 5 {
            let len = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
            assert_eq!(body[0], 0, "an uncompressed message");
            reply.message = body[5..5 + len].to_vec();
        }
        reply
    }
}

/// Two calls on one connection with each authority (the second indexes the first's
/// `:authority` from the dynamic table), then a valid one.
async fn answers_any_authority<T: Message + Default>(socket: &Path, path: &str, check: impl Fn(T)) {
    let mut client = RawClient::connect(socket).await;
    for authority in [
        GRPC_GO_AUTHORITY,
        GRPC_GO_AUTHORITY,
        "/run/x.sock",
        "/run/x.sock",
        "localhost",
    ] {
        let reply = client.call(authority, path).await;
        assert_eq!(
            reply.reset, None,
            "{path} with :authority {authority:?} was reset (1 = PROTOCOL_ERROR): {reply:?}"
        );
        assert_eq!(
            reply.grpc_status(),
            Some("0"),
            "{path} with {authority:?}: {reply:?}"
        );
        assert!(
            reply.headers.contains(&(":status".into(), "200".into())),
            "{reply:?}"
        );
        check(T::decode(reply.message.as_slice()).unwrap());
    }
}

#[tokio::test]
async fn every_unix_socket_answers_calls_whatever_their_authority() {
    let daemon = InProcessDaemon::start(&[]).await;
    answers_any_authority(
        &daemon.registration_socket,
        "/pluginregistration.Registration/GetInfo",
        |info: PluginInfo| {
            assert_eq!(info.name, "localvol.csi.dev");
            assert_eq!(info.r#type, "CSIPlugin");
            assert_eq!(info.endpoint, daemon.socket.to_str().unwrap());
        },
    )
    .await;
    answers_any_authority(
        &daemon.socket,
        "/csi.v1.Identity/GetPluginInfo",
        |info: GetPluginInfoResponse| assert_eq!(info.name, "localvol.csi.dev"),
    )
    .await;
    answers_any_authority(
        &daemon.addons_socket,
        "/identity.Identity/GetIdentity",
        |identity: GetIdentityResponse| assert_eq!(identity.name, "localvol.csi.dev"),
    )
    .await;
    daemon.stop().await;
}
