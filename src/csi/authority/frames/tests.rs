use super::*;
use localvol_grpc_frames::{
    self as t, CONTINUATION, END_HEADERS, END_STREAM, GRPC_GO_AUTHORITY, GrpcGoEncoder, HEADERS, PADDED,
    PRIORITY, frame, grpc_request, preface_and_settings, server_view, split_frames, with_authority,
};

const PATH: &str = "/pluginregistration.Registration/GetInfo";

/// Everything the server reads when the client sends `input` in one piece and closes.
fn rewrite(input: &[u8]) -> Vec<u8> {
    let mut rewriter = FrameRewriter::default();
    let mut input = BytesMut::from(input);
    let mut output = BytesMut::new();
    rewriter.feed(&mut input, &mut output).unwrap();
    rewriter.finish(&mut input, &mut output);
    output.to_vec()
}

/// The same, one octet at a time.
fn rewrite_bytewise(input: &[u8]) -> Vec<u8> {
    let mut rewriter = FrameRewriter::default();
    let mut pending = BytesMut::new();
    let mut output = BytesMut::new();
    for &b in input {
        pending.put_u8(b);
        rewriter.feed(&mut pending, &mut output).unwrap();
    }
    rewriter.finish(&mut pending, &mut output);
    output.to_vec()
}

/// A gRPC call as grpc-go sends it: HEADERS, a DATA frame with an empty message
/// and END_STREAM, then a WINDOW_UPDATE and a PING (which must go through untouched).
fn call(encoder: &mut GrpcGoEncoder, stream: u32, authority: &str) -> Vec<u8> {
    let block = encoder.encode(&grpc_request(authority, PATH));
    let mut out = frame(HEADERS, END_HEADERS, stream, &block);
    out.extend(others(stream));
    out
}

fn others(stream: u32) -> Vec<u8> {
    let mut out = frame(0x0, END_STREAM, stream, &[0, 0, 0, 0, 0]);
    out.extend(frame(0x8, 0, 0, &[0, 1, 0, 0]));
    out.extend(frame(0x6, 0, 0, b"pingpong"));
    out
}

fn non_header_frames(bytes: &[u8]) -> Vec<t::Frame> {
    split_frames(bytes)
        .into_iter()
        .filter(|f| f.kind != HEADERS && f.kind != CONTINUATION)
        .collect()
}

#[test]
fn grpc_go_calls_reach_h2_with_localhost_and_all_else_untouched() {
    for authority in [GRPC_GO_AUTHORITY, "/run/x.sock"] {
        let mut encoder = GrpcGoEncoder::default();
        let mut input = preface_and_settings();
        input.extend(call(&mut encoder, 1, authority));
        input.extend(call(&mut encoder, 3, authority));
        let output = rewrite(&input);
        assert_eq!(rewrite_bytewise(&input), output, "{authority}");
        let expected = with_authority(&grpc_request(authority, PATH), "localhost");
        assert_eq!(
            server_view(&output),
            vec![(1, expected.clone()), (3, expected)],
            "{authority}"
        );
        assert_eq!(non_header_frames(&output), non_header_frames(&input));
        assert!(output.starts_with(&preface_and_settings()));
    }
}

#[test]
fn a_valid_authority_passes_byte_for_byte() {
    let mut encoder = GrpcGoEncoder::default();
    let mut input = preface_and_settings();
    input.extend(call(&mut encoder, 1, "localhost"));
    // The same block split over HEADERS and two CONTINUATION frames, padded, with priority.
    let block = encoder.encode(&grpc_request("localhost", PATH));
    let mut payload = vec![3];
    payload.extend_from_slice(&[0x80, 0, 0, 1, 15]);
    payload.extend_from_slice(&block[..4]);
    payload.extend_from_slice(&[0, 0, 0]);
    input.extend(frame(HEADERS, PADDED | PRIORITY | END_STREAM, 3, &payload));
    input.extend(frame(CONTINUATION, 0, 3, &block[4..8]));
    input.extend(frame(CONTINUATION, END_HEADERS, 3, &block[8..]));
    assert_eq!(rewrite(&input), input);
    assert_eq!(rewrite_bytewise(&input), input);
}

#[test]
fn a_block_split_over_continuation_frames_is_rewritten_whole() {
    let request = grpc_request(GRPC_GO_AUTHORITY, PATH);
    let block = GrpcGoEncoder::default().encode(&request);
    let mut input = preface_and_settings();
    input.extend(frame(HEADERS, 0, 1, &block[..5]));
    input.extend(frame(CONTINUATION, 0, 1, &block[5..30]));
    input.extend(frame(CONTINUATION, END_HEADERS, 1, &block[30..]));
    input.extend(others(1));
    let output = rewrite(&input);
    assert_eq!(rewrite_bytewise(&input), output);
    assert_eq!(
        server_view(&output),
        vec![(1, with_authority(&request, "localhost"))]
    );
    assert_eq!(non_header_frames(&output), non_header_frames(&input));
}

#[test]
fn padding_is_dropped_and_priority_and_end_stream_are_kept() {
    let request = grpc_request("/run/x.sock", PATH);
    let block = GrpcGoEncoder::default().encode(&request);
    let mut payload = vec![7];
    payload.extend_from_slice(&[0x80, 0, 0, 1, 200]);
    payload.extend_from_slice(&block);
    payload.extend_from_slice(&[0; 7]);
    let mut input = preface_and_settings();
    input.extend(frame(
        HEADERS,
        PADDED | PRIORITY | END_STREAM | END_HEADERS,
        5,
        &payload,
    ));
    let output = rewrite(&input);
    let frames = split_frames(&output);
    assert_eq!(frames[1].kind, HEADERS);
    assert_eq!(frames[1].flags, PRIORITY | END_STREAM | END_HEADERS);
    assert_eq!(frames[1].payload[..5], [0x80, 0, 0, 1, 200]);
    assert_eq!(
        server_view(&output),
        vec![(5, with_authority(&request, "localhost"))]
    );
}

#[test]
fn a_large_rewritten_block_is_split_at_the_initial_frame_size() {
    let mut request = grpc_request("/run/x.sock", PATH);
    request.push(("x-big".into(), "v".repeat(40_000)));
    // Sent by the client in frames of 10 000 octets (under the same limit).
    let block = GrpcGoEncoder::default().encode(&request);
    let mut input = preface_and_settings();
    let chunks: Vec<&[u8]> = block.chunks(10_000).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        let kind = if i == 0 { HEADERS } else { CONTINUATION };
        let flags = if i + 1 == chunks.len() { END_HEADERS } else { 0 };
        input.extend(frame(kind, flags, 1, chunk));
    }
    let output = rewrite(&input);
    // split_frames asserts every frame fits MAX_FRAME_PAYLOAD.
    let frames = split_frames(&output);
    assert!(frames.len() >= 4, "{} frames", frames.len());
    let ends: Vec<bool> = frames[1..].iter().map(|f| f.flags & END_HEADERS != 0).collect();
    assert_eq!(ends.iter().filter(|e| **e).count(), 1);
    assert!(ends.last().unwrap());
    assert_eq!(
        server_view(&output),
        vec![(1, with_authority(&request, "localhost"))]
    );
}

#[test]
fn a_truncated_frame_is_held_back_then_passed_on_at_the_end() {
    let mut encoder = GrpcGoEncoder::default();
    let mut input = preface_and_settings();
    input.extend(call(&mut encoder, 1, GRPC_GO_AUTHORITY));
    let whole = rewrite(&input);
    let cut = frame(HEADERS, END_HEADERS, 3, &[0x82, 0x86])[..7].to_vec();
    let truncated_block = frame(HEADERS, 0, 5, &[0x82]);
    let data = frame(0x0, 0, 1, b"abc")[..10].to_vec();
    for (tail, streams) in [(cut, false), (truncated_block, false), (data, true)] {
        let mut rewriter = FrameRewriter::default();
        let mut pending = BytesMut::from(&[input.clone(), tail.clone()].concat()[..]);
        let mut output = BytesMut::new();
        rewriter.feed(&mut pending, &mut output).unwrap();
        if streams {
            // A DATA frame streams through as it arrives.
            assert_eq!(output[..], [whole.clone(), tail.clone()].concat()[..]);
        } else {
            assert_eq!(output[..], whole[..], "the incomplete part waits");
        }
        rewriter.finish(&mut pending, &mut output);
        assert_eq!(output[..], [whole.clone(), tail].concat()[..]);
    }
}

#[test]
fn an_oversize_header_block_is_an_error() {
    let mut rewriter = FrameRewriter::default();
    let mut output = BytesMut::new();
    let mut input = BytesMut::from(&preface_and_settings()[..]);
    input.extend_from_slice(&frame(HEADERS, 0, 1, &[0x82; 16_000]));
    rewriter.feed(&mut input, &mut output).unwrap();
    let error = loop {
        input.extend_from_slice(&frame(CONTINUATION, 0, 1, &[0x82; 16_000]));
        if let Err(e) = rewriter.feed(&mut input, &mut output) {
            break e;
        }
    };
    assert_eq!(error, FrameError::HeaderBlockTooLarge { stream: 1 });
    // A single frame announcing more than the limit fails before its payload arrives.
    let mut rewriter = FrameRewriter::default();
    let mut input = BytesMut::from(&preface_and_settings()[..]);
    input.extend_from_slice(&[0x20, 0, 0, HEADERS, END_HEADERS, 0, 0, 0, 1]);
    assert!(rewriter.feed(&mut input, &mut BytesMut::new()).is_err());
}

/// Anything that is not a well-formed frame stream goes to h2 as it is, and so does
/// everything after it, even a header block that would otherwise be rewritten.
#[test]
fn malformed_streams_pass_through_untouched() {
    let bad_call = call(&mut GrpcGoEncoder::default(), 7, GRPC_GO_AUTHORITY);
    let block = GrpcGoEncoder::default().encode(&grpc_request(GRPC_GO_AUTHORITY, PATH));
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("not HTTP/2", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        ("a PING inside a header block", {
            let mut v = preface_and_settings();
            v.extend(frame(HEADERS, 0, 1, &block[..5]));
            v.extend(frame(0x6, 0, 0, b"pingpong"));
            v.extend(frame(CONTINUATION, END_HEADERS, 1, &block[5..]));
            v
        }),
        ("CONTINUATION of another stream", {
            let mut v = preface_and_settings();
            v.extend(frame(HEADERS, 0, 1, &block[..5]));
            v.extend(frame(CONTINUATION, END_HEADERS, 3, &block[5..]));
            v
        }),
        ("padding longer than the frame", {
            let mut v = preface_and_settings();
            v.extend(frame(HEADERS, PADDED | END_HEADERS, 1, &[200, 0x82]));
            v
        }),
        ("priority cut short", {
            let mut v = preface_and_settings();
            v.extend(frame(HEADERS, PRIORITY | END_HEADERS, 1, &[0, 0]));
            v
        }),
        ("an undecodable block", {
            let mut v = preface_and_settings();
            v.extend(frame(HEADERS, END_HEADERS, 1, &[0xbe]));
            v
        }),
    ];
    for (what, mut input) in cases {
        input.extend_from_slice(&bad_call);
        assert_eq!(rewrite(&input), input, "{what}");
        assert_eq!(rewrite_bytewise(&input), input, "{what}");
    }
}
