//! One HPACK header block at a time: decode it against the client's dynamic table and,
//! when its `:authority` is not one h2 accepts, encode it again with `localhost` instead.
//!
//! A rewritten block must not change h2's own decoder table, or every later block of the
//! connection would index into a table h2 does not have. So rewritten blocks use only
//! literal representations without indexing (or never indexed, where the client said
//! so), with literal names; h2's table stays as the last untouched block left it and is
//! never referred to again. For the same reason, once one block is rewritten every
//! later block of the connection is re-encoded too: the client's blocks may refer to
//! entries that only the client's table (tracked here) holds.

use std::io::Write as _;

use loona_hpack::encoder::encode_integer_into;

/// What h2 starts its decoder table at (SETTINGS_HEADER_TABLE_SIZE, which neither h2's
/// server nor tonic change): a client may not grow its table beyond it.
const HEADER_TABLE_SIZE: usize = 4096;

/// Stands in for a rejected authority: what kubelet's own CSI client sends.
pub const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum HeaderBlockError {
    #[error("truncated HPACK {0}")]
    Truncated(&'static str),
    #[error("HPACK integer longer than 5 octets")]
    IntegerTooLong,
    #[error("dynamic table size update after a header field")]
    LateSizeUpdate,
    #[error("HPACK decoding failed: {0:?}")]
    Decode(loona_hpack::decoder::DecoderError),
}

/// How the client represented one header field, as far as a re-encoding must keep it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sensitivity {
    /// Indexed, or literal with or without indexing.
    Ordinary,
    /// Literal never indexed: intermediaries must keep it so (RFC 7541 §6.2.3).
    NeverIndexed,
}

/// What became of a block.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Pass the client's bytes on as they are.
    Unchanged,
    /// Send this block instead. `replaced` is the rejected authority, if this block had one.
    Rewritten {
        block: Vec<u8>,
        replaced: Option<Vec<u8>>,
    },
}

/// The client→server header blocks of one connection.
pub struct HeaderBlocks {
    /// Mirrors the client's encoder table.
    decoder: loona_hpack::Decoder<'static>,
    /// A block was rewritten: from now on h2's table lags the client's.
    re_encoding: bool,
}

impl std::fmt::Debug for HeaderBlocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeaderBlocks")
            .field("re_encoding", &self.re_encoding)
            .finish_non_exhaustive()
    }
}

impl Default for HeaderBlocks {
    fn default() -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(HEADER_TABLE_SIZE);
        Self {
            decoder,
            re_encoding: false,
        }
    }
}

impl HeaderBlocks {
    /// Decodes `block` (a whole header block: HEADERS plus CONTINUATION fragments) and
    /// says what to send instead. After an error the client's table is no longer known:
    /// the caller must stop interpreting this connection.
    pub fn rewrite(&mut self, block: &[u8]) -> Result<Outcome, HeaderBlockError> {
        let sensitivities = field_sensitivities(block)?;
        let fields = self.decoder.decode(block).map_err(HeaderBlockError::Decode)?;
        debug_assert_eq!(fields.len(), sensitivities.len());
        let replaced = fields
            .iter()
            .find(|(name, value)| name == b":authority" && !is_valid_authority(value))
            .map(|(_, value)| value.clone());
        if replaced.is_none() && !self.re_encoding {
            return Ok(Outcome::Unchanged);
        }
        self.re_encoding = true;
        let mut out = Vec::with_capacity(block.len() * 2);
        for ((name, value), sensitivity) in fields.iter().zip(sensitivities) {
            let value = if name == b":authority" && !is_valid_authority(value) {
                REPLACEMENT_AUTHORITY
            } else {
                value.as_slice()
            };
            encode_literal(name, value, sensitivity, &mut out);
        }
        Ok(Outcome::Rewritten { block: out, replaced })
    }
}

/// What h2 accepts as `:authority` (it parses it as an `http` authority).
fn is_valid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// Literal header field without indexing (`0000`) or never indexed (`0001`), with a
/// literal name (index 0) and both strings without Huffman coding (RFC 7541 §6.2.2-3).
fn encode_literal(name: &[u8], value: &[u8], sensitivity: Sensitivity, out: &mut Vec<u8>) {
    out.push(match sensitivity {
        Sensitivity::Ordinary => 0x00,
        Sensitivity::NeverIndexed => 0x10,
    });
    for string in [name, value] {
        // Writing to a Vec cannot fail.
        let _ = encode_integer_into(string.len(), 7, 0x00, out);
        let _ = out.write_all(string);
    }
}

/// Walks the representations of `block` (RFC 7541 §6) without decoding strings: one
/// entry per header field, so that never-indexed fields stay never indexed. Also
/// rejects what the decoder would let through but h2 would not: a table size update
/// after a field.
fn field_sensitivities(block: &[u8]) -> Result<Vec<Sensitivity>, HeaderBlockError> {
    let mut sensitivities = Vec::new();
    let mut rest = block;
    while let Some(&first) = rest.first() {
        let literal = |prefix: u8, rest: &[u8]| -> Result<usize, HeaderBlockError> {
            let (name_index, mut used) = integer(rest, prefix)?;
            if name_index == 0 {
                used += string_len(&rest[used..])?;
            }
            Ok(used + string_len(&rest[used..])?)
        };
        let used = if first & 0x80 != 0 {
            sensitivities.push(Sensitivity::Ordinary);
            integer(rest, 7)?.1
        } else if first & 0x40 != 0 {
            sensitivities.push(Sensitivity::Ordinary);
            literal(6, rest)?
        } else if first & 0x20 != 0 {
            if !sensitivities.is_empty() {
                return Err(HeaderBlockError::LateSizeUpdate);
            }
            integer(rest, 5)?.1
        } else if first & 0x10 != 0 {
            sensitivities.push(Sensitivity::NeverIndexed);
            literal(4, rest)?
        } else {
            sensitivities.push(Sensitivity::Ordinary);
            literal(4, rest)?
        };
        rest = &rest[used..];
    }
    Ok(sensitivities)
}

/// An HPACK integer with a `prefix`-bit prefix (RFC 7541 §5.1): (value, octets used).
fn integer(bytes: &[u8], prefix: u8) -> Result<(usize, usize), HeaderBlockError> {
    let first = *bytes.first().ok_or(HeaderBlockError::Truncated("integer"))?;
    let max_prefix = (1usize << prefix) - 1;
    let mut value = usize::from(first) & max_prefix;
    if value < max_prefix {
        return Ok((value, 1));
    }
    // Five octets carry up to 2^28, far more than any length a block can hold.
    for (i, &octet) in bytes.iter().enumerate().skip(1).take(4) {
        value += usize::from(octet & 0x7f) << (7 * (i - 1));
        if octet & 0x80 == 0 {
            return Ok((value, i + 1));
        }
    }
    if bytes.len() >= 5 {
        Err(HeaderBlockError::IntegerTooLong)
    } else {
        Err(HeaderBlockError::Truncated("integer"))
    }
}

/// The octets a string literal takes (RFC 7541 §5.2), its length prefix included.
fn string_len(bytes: &[u8]) -> Result<usize, HeaderBlockError> {
    let (len, used) = integer(bytes, 7)?;
    let total = used + len;
    if total > bytes.len() {
        return Err(HeaderBlockError::Truncated("string"));
    }
    Ok(total)
}

#[cfg(test)]
mod tests;
