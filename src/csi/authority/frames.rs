//! The client→server HTTP/2 byte stream, frame by frame (RFC 9113 §3.4, §4.1, §6.2,
//! §6.10): header blocks are collected and handed to [`HeaderBlocks`]; every other frame
//! goes on untouched as its bytes arrive.
//!
//! Whatever does not parse as HTTP/2 is passed on as it is, and so is everything after
//! it: h2 then reports the protocol error itself, as it would without this layer.

use bytes::{BufMut, BytesMut};
use tracing::debug;

use super::header_block::{HeaderBlocks, Outcome};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// Stream dependency (4 octets) and weight (1) of a HEADERS frame with PRIORITY.
const PRIORITY_LEN: usize = 5;
/// The largest frame a peer must accept without asking (SETTINGS_MAX_FRAME_SIZE's
/// initial value); rewritten blocks are framed to it whatever the server advertised.
pub const MAX_FRAME_PAYLOAD: usize = 16_384;
/// A header block beyond this closes the connection: buffering it whole is the price
/// of rewriting it, and no gRPC call needs a fraction of it.
pub const MAX_HEADER_BLOCK: usize = 1 << 20;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("HTTP/2 header block of more than {MAX_HEADER_BLOCK} bytes on stream {stream}")]
    HeaderBlockTooLarge { stream: u32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// This many octets of the connection preface have gone by.
    Preface(usize),
    /// At a frame boundary.
    FrameHeader,
    /// Passing on the rest of a frame's payload.
    Forward(usize),
    /// Not HTTP/2 as expected: everything goes on untouched from here.
    Passthrough,
}

/// A HEADERS frame whose CONTINUATION frames have not all arrived.
#[derive(Debug)]
struct PendingBlock {
    stream: u32,
    /// END_STREAM and PRIORITY as the HEADERS frame had them.
    flags: u8,
    priority: Option<[u8; PRIORITY_LEN]>,
    fragments: Vec<u8>,
    /// The frames as received, for when the block goes on unchanged.
    original: Vec<u8>,
}

/// Rewrites the client→server half of one connection.
#[derive(Debug)]
pub struct FrameRewriter {
    state: State,
    pending: Option<PendingBlock>,
    blocks: HeaderBlocks,
    /// A rewrite was logged on this connection.
    logged: bool,
}

impl Default for FrameRewriter {
    fn default() -> Self {
        Self {
            state: State::Preface(0),
            pending: None,
            blocks: HeaderBlocks::default(),
            logged: false,
        }
    }
}

struct FrameHeader {
    len: usize,
    kind: u8,
    flags: u8,
    stream: u32,
}

impl FrameHeader {
    fn parse(bytes: &[u8]) -> Self {
        Self {
            len: usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]),
            kind: bytes[3],
            flags: bytes[4],
            stream: u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff,
        }
    }
}

impl FrameRewriter {
    /// Consumes what it can of `input` into `output`. What stays in `input` is an
    /// incomplete frame header or header block: call again with more bytes appended.
    pub fn feed(&mut self, input: &mut BytesMut, output: &mut BytesMut) -> Result<(), FrameError> {
        loop {
            match self.state {
                State::Passthrough => {
                    output.put(input.split());
                    return Ok(());
                }
                State::Preface(seen) => {
                    let n = input.len().min(PREFACE.len() - seen);
                    if input[..n] != PREFACE[seen..seen + n] {
                        self.state = State::Passthrough;
                        continue;
                    }
                    output.put(input.split_to(n));
                    if seen + n < PREFACE.len() {
                        self.state = State::Preface(seen + n);
                        return Ok(());
                    }
                    self.state = State::FrameHeader;
                }
                State::Forward(remaining) => {
                    let n = input.len().min(remaining);
                    output.put(input.split_to(n));
                    if n < remaining {
                        self.state = State::Forward(remaining - n);
                        return Ok(());
                    }
                    self.state = State::FrameHeader;
                }
                State::FrameHeader => {
                    if input.len() < FRAME_HEADER_LEN {
                        return Ok(());
                    }
                    let header = FrameHeader::parse(input);
                    if self.pending.is_none() && header.kind != HEADERS {
                        output.put(input.split_to(FRAME_HEADER_LEN));
                        self.state = State::Forward(header.len);
                        continue;
                    }
                    if !self.header_frame(&header, input, output)? {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// The connection ended: passes on whatever is held back (a truncated frame or
    /// header block), for h2 to see it as it was sent.
    pub fn finish(&mut self, input: &mut BytesMut, output: &mut BytesMut) {
        if let Some(pending) = self.pending.take() {
            output.put_slice(&pending.original);
        }
        output.put(input.split());
        self.state = State::Passthrough;
    }

    /// A HEADERS frame, or any frame while a header block is open. Returns false when
    /// the frame has not fully arrived.
    fn header_frame(
        &mut self,
        header: &FrameHeader,
        input: &mut BytesMut,
        output: &mut BytesMut,
    ) -> Result<bool, FrameError> {
        let collected = self.pending.as_ref().map_or(0, |p| p.fragments.len());
        if let Some(pending) = &self.pending
            && (header.kind != CONTINUATION || header.stream != pending.stream)
        {
            // Only CONTINUATION of the same stream may follow an open header block.
            self.give_up(output);
            return Ok(true);
        }
        if collected + header.len > MAX_HEADER_BLOCK {
            return Err(FrameError::HeaderBlockTooLarge {
                stream: header.stream,
            });
        }
        if input.len() < FRAME_HEADER_LEN + header.len {
            return Ok(false);
        }
        let frame = input.split_to(FRAME_HEADER_LEN + header.len);
        let payload = &frame[FRAME_HEADER_LEN..];
        match &mut self.pending {
            Some(pending) => {
                pending.fragments.extend_from_slice(payload);
                pending.original.extend_from_slice(&frame);
            }
            None => {
                let Some((priority, fragment)) = split_headers_payload(header.flags, payload) else {
                    output.put(frame);
                    self.state = State::Passthrough;
                    return Ok(true);
                };
                self.pending = Some(PendingBlock {
                    stream: header.stream,
                    flags: header.flags & (END_STREAM | PRIORITY),
                    priority,
                    fragments: fragment.to_vec(),
                    original: frame.to_vec(),
                });
            }
        }
        if header.flags & END_HEADERS != 0 {
            self.complete_block(output);
        }
        Ok(true)
    }

    fn complete_block(&mut self, output: &mut BytesMut) {
        let Some(block) = self.pending.take() else {
            return;
        };
        match self.blocks.rewrite(&block.fragments) {
            Ok(Outcome::Unchanged) => output.put_slice(&block.original),
            Ok(Outcome::Rewritten {
                block: rewritten,
                replaced,
            }) => {
                if let Some(authority) = replaced
                    && !self.logged
                {
                    self.logged = true;
                    debug!(
                        authority = %String::from_utf8_lossy(&authority),
                        "HTTP/2 :authority is not a valid authority; passing localhost on instead, for this connection"
                    );
                }
                write_block(&block, &rewritten, output);
            }
            Err(error) => {
                debug!(%error, "undecodable HTTP/2 header block; passing the connection through untouched");
                output.put_slice(&block.original);
                self.state = State::Passthrough;
            }
        }
    }

    /// Passes on the open block as received, and everything after it.
    fn give_up(&mut self, output: &mut BytesMut) {
        if let Some(pending) = self.pending.take() {
            output.put_slice(&pending.original);
        }
        self.state = State::Passthrough;
    }
}

/// Splits a HEADERS payload into its priority fields and header block fragment,
/// dropping the padding; None when the padding or priority overruns the payload.
fn split_headers_payload(flags: u8, payload: &[u8]) -> Option<(Option<[u8; PRIORITY_LEN]>, &[u8])> {
    let mut rest = payload;
    let mut padding = 0;
    if flags & PADDED != 0 {
        padding = usize::from(*rest.first()?);
        rest = &rest[1..];
    }
    let priority = if flags & PRIORITY != 0 {
        let fields: [u8; PRIORITY_LEN] = rest.get(..PRIORITY_LEN)?.try_into().ok()?;
        rest = &rest[PRIORITY_LEN..];
        Some(fields)
    } else {
        None
    };
    let fragment = rest.get(..rest.len().checked_sub(padding)?)?;
    Some((priority, fragment))
}

/// Frames `rewritten` as one HEADERS frame plus CONTINUATION frames, none above the
/// initial maximum frame size, without padding.
fn write_block(block: &PendingBlock, rewritten: &[u8], output: &mut BytesMut) {
    let priority_len = block.priority.map_or(0, |_| PRIORITY_LEN);
    let first_len = rewritten.len().min(MAX_FRAME_PAYLOAD - priority_len);
    let (first, mut rest) = rewritten.split_at(first_len);
    let mut put_frame = |kind: u8, flags: u8, prefix: &[u8], fragment: &[u8], last: bool| {
        let len = prefix.len() + fragment.len();
        let flags = if last { flags | END_HEADERS } else { flags };
        output.put_uint(len as u64, 3);
        output.put_u8(kind);
        output.put_u8(flags);
        output.put_u32(block.stream);
        output.put_slice(prefix);
        output.put_slice(fragment);
    };
    let priority = block.priority.unwrap_or_default();
    put_frame(
        HEADERS,
        block.flags,
        &priority[..priority_len],
        first,
        rest.is_empty(),
    );
    while !rest.is_empty() {
        let (chunk, after) = rest.split_at(rest.len().min(MAX_FRAME_PAYLOAD));
        rest = after;
        put_frame(CONTINUATION, 0, &[], chunk, rest.is_empty());
    }
}

#[cfg(test)]
mod tests;
