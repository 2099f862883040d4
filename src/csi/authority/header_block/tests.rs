use super::*;
use localvol_grpc_frames::{GRPC_GO_AUTHORITY, GrpcGoEncoder, grpc_request, with_authority};

const PATH: &str = "/pluginregistration.Registration/GetInfo";

/// One connection: the client's encoder, the rewriter, and h2's decoder behind it.
#[derive(Default)]
struct Connection {
    client: GrpcGoEncoder,
    blocks: HeaderBlocks,
    h2: loona_hpack::Decoder<'static>,
}

impl Connection {
    /// Sends `block` through the rewriter: whether it was rewritten, and what h2 decodes.
    fn pass(&mut self, block: &[u8]) -> (bool, Vec<(String, String)>) {
        let outcome = self.blocks.rewrite(block).unwrap();
        let rewritten = outcome != Outcome::Unchanged;
        let sent = match outcome {
            Outcome::Unchanged => block.to_vec(),
            Outcome::Rewritten { block, .. } => block,
        };
        (rewritten, h2_decode(&mut self.h2, &sent))
    }
}

fn h2_decode(decoder: &mut loona_hpack::Decoder<'static>, block: &[u8]) -> Vec<(String, String)> {
    decoder
        .decode(block)
        .unwrap()
        .into_iter()
        .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
        .collect()
}

#[test]
fn a_percent_encoded_path_becomes_localhost() {
    let request = grpc_request(GRPC_GO_AUTHORITY, PATH);
    let block = GrpcGoEncoder::default().encode(&request);
    let outcome = HeaderBlocks::default().rewrite(&block).unwrap();
    let Outcome::Rewritten {
        block: rewritten,
        replaced,
    } = outcome
    else {
        panic!("not rewritten: {outcome:?}")
    };
    assert_eq!(replaced.as_deref(), Some(GRPC_GO_AUTHORITY.as_bytes()));
    let seen = h2_decode(&mut loona_hpack::Decoder::new(), &rewritten);
    assert_eq!(seen, with_authority(&request, "localhost"));
}

#[test]
fn a_raw_path_becomes_localhost() {
    for authority in ["/run/x.sock", "", "a b", "host:port:x"] {
        let request = grpc_request(authority, PATH);
        let block = GrpcGoEncoder::default().encode(&request);
        let Outcome::Rewritten { block: rewritten, .. } = HeaderBlocks::default().rewrite(&block).unwrap()
        else {
            panic!("{authority:?} not rewritten")
        };
        let seen = h2_decode(&mut loona_hpack::Decoder::new(), &rewritten);
        assert_eq!(seen, with_authority(&request, "localhost"), "{authority:?}");
    }
}

#[test]
fn valid_authorities_are_left_alone() {
    for authority in [
        "localhost",
        "localhost:50051",
        "10.0.0.1:80",
        "[::1]:9",
        "csi.sock",
    ] {
        let block = GrpcGoEncoder::default().encode(&grpc_request(authority, PATH));
        assert_eq!(
            HeaderBlocks::default().rewrite(&block).unwrap(),
            Outcome::Unchanged,
            "{authority:?}"
        );
    }
    // A block without :authority (trailers, or a request translated from HTTP/1).
    let block = GrpcGoEncoder::default().encode(&[("grpc-status".into(), "0".into())]);
    assert_eq!(
        HeaderBlocks::default().rewrite(&block).unwrap(),
        Outcome::Unchanged
    );
}

/// The second request refers to the first one's :authority in the client's dynamic
/// table; h2's table never saw it, so the second block must be rewritten too.
#[test]
fn dynamic_table_references_across_requests_resolve_against_the_clients_table() {
    let mut connection = Connection::default();
    let first = grpc_request(GRPC_GO_AUTHORITY, PATH);
    let second = grpc_request(
        GRPC_GO_AUTHORITY,
        "/pluginregistration.Registration/NotifyRegistrationStatus",
    );
    let first_block = connection.client.encode(&first);
    let second_block = connection.client.encode(&second);
    // The second block ends with :authority, content-type, user-agent, te and
    // grpc-timeout, each one octet indexing the dynamic table (index 62 and up).
    let tail = &second_block[second_block.len() - 5..];
    assert!(tail.iter().all(|&octet| octet >= 0x80 | 62), "{second_block:?}");
    for (block, request) in [(&first_block, &first), (&second_block, &second)] {
        assert_eq!(
            connection.pass(block),
            (true, with_authority(request, "localhost"))
        );
    }
}

/// A connection whose first call was fine and whose later calls are not: the first
/// block goes through as it is (and enters h2's table), later ones are re-encoded,
/// even a valid one that indexes entries h2's table does not hold.
#[test]
fn blocks_after_a_rewrite_are_re_encoded() {
    let mut connection = Connection::default();
    let calls = [
        grpc_request("localhost", PATH),
        grpc_request("/run/x.sock", PATH),
        grpc_request("localhost", PATH),
        grpc_request("/run/x.sock", PATH),
    ];
    for (i, request) in calls.iter().enumerate() {
        let block = connection.client.encode(request);
        let expected = (i > 0, with_authority(request, "localhost"));
        assert_eq!(connection.pass(&block), expected, "call {i}");
    }
}

/// The client empties its table with size updates at the start of a block: later
/// indices refer to the entries made after that.
#[test]
fn table_size_updates_are_tracked() {
    let mut connection = Connection::default();
    let block = connection.client.encode(&grpc_request(GRPC_GO_AUTHORITY, PATH));
    connection.pass(&block);

    let mut block = Vec::new();
    connection.client.size_update(0, &mut block);
    connection.client.size_update(4096, &mut block);
    let second = grpc_request("/other/path.sock", "/x.Y/Z");
    block.extend(connection.client.encode(&second));
    let expected = (true, with_authority(&second, "localhost"));
    assert_eq!(connection.pass(&block), expected);

    // Index 62 is now the second block's first new entry, not the first block's.
    let third = connection.client.encode(&second);
    assert_eq!(connection.pass(&third), expected);

    // Growing the table beyond h2's setting is refused, and so is an update after a field.
    let mut block = Vec::new();
    GrpcGoEncoder::default().size_update(8192, &mut block);
    block.push(0x82);
    assert!(matches!(
        HeaderBlocks::default().rewrite(&block),
        Err(HeaderBlockError::Decode(_))
    ));
    let mut block = vec![0x82];
    GrpcGoEncoder::default().size_update(0, &mut block);
    assert_eq!(
        HeaderBlocks::default().rewrite(&block),
        Err(HeaderBlockError::LateSizeUpdate)
    );
}

#[test]
fn never_indexed_fields_stay_never_indexed() {
    // :authority literal without indexing, name index 1; then "authorization" never indexed.
    let mut block = vec![0x01, 11];
    block.extend_from_slice(b"/run/x.sock");
    block.extend_from_slice(&[0x10, 13]);
    block.extend_from_slice(b"authorization");
    block.extend_from_slice(&[6]);
    block.extend_from_slice(b"secret");
    let Outcome::Rewritten { block: rewritten, .. } = HeaderBlocks::default().rewrite(&block).unwrap() else {
        panic!("not rewritten")
    };
    let mut expected = vec![0x00, 10];
    expected.extend_from_slice(b":authority");
    expected.push(9);
    expected.extend_from_slice(b"localhost");
    expected.extend_from_slice(&[0x10, 13]);
    expected.extend_from_slice(b"authorization");
    expected.push(6);
    expected.extend_from_slice(b"secret");
    assert_eq!(rewritten, expected);
}

#[test]
fn truncated_or_malformed_blocks_are_errors_not_panics() {
    let block = GrpcGoEncoder::default().encode(&grpc_request(GRPC_GO_AUTHORITY, PATH));
    for len in 1..block.len() {
        // Cut inside a field: an error; cut between fields: a shorter valid block.
        let _ = HeaderBlocks::default().rewrite(&block[..len]);
    }
    assert_eq!(
        HeaderBlocks::default().rewrite(&[0x41, 0x85, b'a']),
        Err(HeaderBlockError::Truncated("string"))
    );
    assert_eq!(
        HeaderBlocks::default().rewrite(&[0x7f]),
        Err(HeaderBlockError::Truncated("integer"))
    );
    assert_eq!(
        HeaderBlocks::default().rewrite(&[0xff, 0xff, 0xff, 0xff, 0xff, 0x01]),
        Err(HeaderBlockError::IntegerTooLong)
    );
    // Index beyond both tables.
    assert!(matches!(
        HeaderBlocks::default().rewrite(&[0xbe]),
        Err(HeaderBlockError::Decode(_))
    ));
    // Arbitrary bytes never panic.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..2000 {
        let len = (seed % 40) as usize;
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        let _ = HeaderBlocks::default().rewrite(&bytes);
    }
}
