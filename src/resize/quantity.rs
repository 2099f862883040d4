//! Storage quantities of the API objects (their text, as [`crate::k8s::claim_resize`]
//! reads and writes them): read and written with the one parser and format of
//! [`crate::model::quantity`].

use crate::model::quantity::{format_bytes, parse_bytes};

/// Bytes in the quantity `q`, rounded up to a whole byte. `None` for anything that is
/// not a non-negative storage quantity (milli-bytes, negative numbers, text).
pub fn bytes(q: &str) -> Option<u64> {
    parse_bytes(q).ok()
}

/// `bytes` as a quantity: `2Gi`, `1536Mi`, or plain bytes when no suffix divides it.
pub fn format(bytes: u64) -> String {
    format_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    // The grammar's table tests are beside the parser, in model/quantity/tests.rs.
    #[test]
    fn api_quantities_go_through_the_one_parser() {
        assert_eq!(bytes("1.5Gi"), Some(3 << 29));
        assert_eq!(bytes("100m"), None);
        assert_eq!(format(1536 << 20), "1536Mi");
    }
}
