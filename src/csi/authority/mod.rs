//! Any `:authority` a client sends on localvol's unix sockets is accepted.
//!
//! On a unix socket the authority means nothing, and clients fill it in as they like:
//! grpc-go (kubelet's plugin registration) sends the socket path percent-encoded
//! (`%2Fvar%2Flib%2Fkubelet%2F...`), grpc-python and grpc-java the raw path. h2, under
//! tonic, parses `:authority` as a URI authority, answers both with RST_STREAM
//! PROTOCOL_ERROR and has no option to relax that. So every accepted connection is
//! read through [`NormalizedStream`], which rewrites a header block whose `:authority`
//! h2 would reject to one with `localhost` (what kubelet's own CSI client sends), and
//! passes every other byte, and everything the server writes, on untouched.

mod frames;
mod header_block;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub use frames::{FrameError, MAX_HEADER_BLOCK};

/// How much is read from the socket at a time.
const READ_CHUNK: usize = 16 * 1024;

/// A server-side connection whose client→server HTTP/2 stream has its `:authority`
/// made acceptable to h2. See the module documentation.
#[derive(Debug)]
pub struct NormalizedStream<S> {
    inner: S,
    rewriter: frames::FrameRewriter,
    /// Read from `inner`, not yet rewritten (an incomplete frame or header block).
    received: BytesMut,
    /// Rewritten, not yet handed to the reader.
    ready: BytesMut,
    /// `inner` reached its end.
    ended: bool,
}

impl<S> NormalizedStream<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            rewriter: frames::FrameRewriter::default(),
            received: BytesMut::new(),
            ready: BytesMut::new(),
            ended: false,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for NormalizedStream<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.ready.is_empty() {
                let n = this.ready.len().min(buf.remaining());
                buf.put_slice(&this.ready.split_to(n));
                return Poll::Ready(Ok(()));
            }
            if this.ended || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; READ_CHUNK];
            let mut chunk_buf = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut chunk_buf))?;
            let read = chunk_buf.filled();
            if read.is_empty() {
                this.ended = true;
                this.rewriter.finish(&mut this.received, &mut this.ready);
                continue;
            }
            this.received.extend_from_slice(read);
            this.rewriter
                .feed(&mut this.received, &mut this.ready)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for NormalizedStream<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for NormalizedStream<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// The server reads exactly what the client wrote when nothing needs rewriting,
    /// and a truncated tail still reaches it before the end of the stream.
    #[tokio::test]
    async fn untouched_bytes_and_a_truncated_tail_reach_the_server() {
        let (mut client, server) = tokio::io::duplex(64);
        let mut server = NormalizedStream::new(server);
        let mut sent = localvol_grpc_frames::preface_and_settings();
        // A PING, then a HEADERS frame header announcing 20 octets that never come.
        sent.extend_from_slice(&[0, 0, 8, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
        sent.extend_from_slice(&[0, 0, 20, 1, 4, 0, 0, 0, 1, 0x82]);
        let writer = {
            let sent = sent.clone();
            tokio::spawn(async move {
                client.write_all(&sent).await.unwrap();
                client.shutdown().await.unwrap();
                client
            })
        };
        let mut received = Vec::new();
        server.read_to_end(&mut received).await.unwrap();
        assert_eq!(received, sent);
        // The server→client direction is the plain socket.
        server.write_all(b"reply").await.unwrap();
        let mut client = writer.await.unwrap();
        let mut reply = [0u8; 5];
        client.read_exact(&mut reply).await.unwrap();
        assert_eq!(&reply, b"reply");
    }

    #[tokio::test]
    async fn an_oversize_header_block_closes_the_connection() {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let mut server = NormalizedStream::new(server);
        tokio::spawn(async move {
            let mut sent = localvol_grpc_frames::preface_and_settings();
            // HEADERS without END_HEADERS, then CONTINUATION frames without end.
            sent.extend_from_slice(&[0, 0x40, 0, 1, 0, 0, 0, 0, 1]);
            sent.extend_from_slice(&[0x82; 0x4000]);
            let _ = client.write_all(&sent).await;
            let continuation = [&[0u8, 0x40, 0, 9, 0, 0, 0, 0, 1][..], &[0x82; 0x4000]].concat();
            while client.write_all(&continuation).await.is_ok() {}
        });
        let mut received = Vec::new();
        let error = server.read_to_end(&mut received).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        assert!(error.to_string().contains("header block of more than"), "{error}");
        assert!(received.len() < 100, "the block was never passed on");
    }
}
