//! Storage quantities of the API objects: read and written with the one parser and
//! format of [`crate::model::quantity`].

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::model::quantity::{format_bytes, parse_bytes};

/// Bytes in `q`, rounded up to a whole byte. `None` for anything that is not a
/// non-negative storage quantity (milli-bytes, negative numbers, text).
pub fn bytes(q: &Quantity) -> Option<u64> {
    parse_bytes(&q.0).ok()
}

/// `bytes` as a quantity: `2Gi`, `1536Mi`, or plain bytes when no suffix divides it.
pub fn format(bytes: u64) -> Quantity {
    Quantity(format_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    // The grammar's table tests are beside the parser, in model/quantity/tests.rs.
    #[test]
    fn api_quantities_go_through_the_one_parser() {
        assert_eq!(bytes(&Quantity("1.5Gi".to_string())), Some(3 << 29));
        assert_eq!(bytes(&Quantity("100m".to_string())), None);
        assert_eq!(format(1536 << 20).0, "1536Mi");
    }
}
