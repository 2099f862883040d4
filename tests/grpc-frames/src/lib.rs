//! Byte fixtures for the rewriter's tests: frames built by hand, header blocks encoded
//! as grpc-go does (Huffman, incremental indexing), and h2's view of the output.
//!
//! A crate of its own (a dev-dependency), so that the library's unit tests and
//! tests/authority.rs use the same fixtures without a `#[path]` include. The wire
//! constants are stated here again on purpose: tests do not take the implementation's
//! word for them.

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// SETTINGS_MAX_FRAME_SIZE's initial value (RFC 9113 §6.5.2).
pub const MAX_FRAME_PAYLOAD: usize = 16_384;
/// Frame types (RFC 9113 §6).
pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const GOAWAY: u8 = 0x7;
pub const CONTINUATION: u8 = 0x9;
/// Frame flags.
pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY: u8 = 0x20;

pub const GRPC_GO_AUTHORITY: &str = "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Flocalvol.csi.dev-reg.sock";

/// One frame: 9-octet header, then the payload.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len().to_be_bytes();
    let mut out = vec![len[5], len[6], len[7], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The client preface and an empty SETTINGS frame.
pub fn preface_and_settings() -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    out
}

/// The request headers of a gRPC call as grpc-go orders them.
pub fn grpc_request(authority: &str, path: &str) -> Vec<(String, String)> {
    [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("user-agent", "grpc-go/1.72.1"),
        ("te", "trailers"),
        ("grpc-timeout", "9999989u"),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_string(), v.to_string()))
    .collect()
}

/// A client-side HPACK encoder that indexes every field and Huffman-codes every
/// string, as grpc-go's does.
#[derive(Default)]
pub struct GrpcGoEncoder(httlib_hpack::Encoder<'static>);

impl GrpcGoEncoder {
    pub fn encode(&mut self, headers: &[(String, String)]) -> Vec<u8> {
        use httlib_hpack::Encoder;
        let flags =
            Encoder::HUFFMAN_NAME | Encoder::HUFFMAN_VALUE | Encoder::WITH_INDEXING | Encoder::BEST_FORMAT;
        let mut out = Vec::new();
        for (name, value) in headers {
            self.0
                .encode(
                    (name.as_bytes().to_vec(), value.as_bytes().to_vec(), flags),
                    &mut out,
                )
                .unwrap();
        }
        out
    }

    pub fn size_update(&mut self, size: u32, out: &mut Vec<u8>) {
        self.0.update_max_dynamic_size(size, out).unwrap();
    }
}

/// A frame as the server receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

/// Splits a client→server byte stream (after the preface) into frames.
pub fn split_frames(bytes: &[u8]) -> Vec<Frame> {
    let mut rest = bytes.strip_prefix(PREFACE).expect("starts with the preface");
    let mut frames = Vec::new();
    while !rest.is_empty() {
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        assert!(len <= MAX_FRAME_PAYLOAD, "frame of {len} octets");
        frames.push(Frame {
            kind: rest[3],
            flags: rest[4],
            stream: u32::from_be_bytes(rest[5..9].try_into().unwrap()),
            payload: rest[9..9 + len].to_vec(),
        });
        rest = &rest[9 + len..];
    }
    frames
}

/// What h2 would decode: each header block of `bytes` (HEADERS with its CONTINUATION
/// frames, unpadded and without priority fields), decoded with one decoder for the
/// connection, as (stream, headers).
pub fn server_view(bytes: &[u8]) -> Vec<(u32, Vec<(String, String)>)> {
    let mut decoder = loona_hpack::Decoder::new();
    let mut blocks = Vec::new();
    let mut open: Option<(u32, Vec<u8>)> = None;
    for frame in split_frames(bytes) {
        let fragment = match (frame.kind, &mut open) {
            (HEADERS, None) => {
                assert_eq!(frame.flags & PADDED, 0, "rewritten blocks carry no padding");
                let skip = if frame.flags & PRIORITY != 0 { 5 } else { 0 };
                open = Some((frame.stream, Vec::new()));
                frame.payload[skip..].to_vec()
            }
            (CONTINUATION, Some((stream, _))) => {
                assert_eq!(*stream, frame.stream);
                frame.payload
            }
            (HEADERS | CONTINUATION, _) => panic!("frame out of place: {frame:?}"),
            _ => continue,
        };
        open.as_mut().unwrap().1.extend_from_slice(&fragment);
        if frame.flags & END_HEADERS != 0 {
            let (stream, block) = open.take().unwrap();
            let headers = decoder
                .decode(&block)
                .unwrap()
                .into_iter()
                .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
                .collect();
            blocks.push((stream, headers));
        }
    }
    blocks
}

/// `headers` with `:authority` set to `authority`.
pub fn with_authority(headers: &[(String, String)], authority: &str) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(n, v)| {
            let v = if n == ":authority" { authority } else { v };
            (n.clone(), v.to_string())
        })
        .collect()
}
