//! Runs the example vectors in `vectors/`: what each byte stream decodes to
//! and how each response is written. Other implementations can use the same
//! files.

use actionfs_protocol::codec::encode_response;
use actionfs_protocol::{Decoded, Request, RequestReader, Response};
use serde_json::Value;

fn load(name: &str) -> Vec<Value> {
    let path = format!("{}/vectors/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

#[test]
fn streams_decode_as_documented() {
    let vectors = load("streams.json");
    assert!(vectors.len() >= 9);
    for vector in vectors {
        let name = vector["name"].as_str().unwrap();
        let stream = vector["stream"].as_str().unwrap();
        let got: Vec<_> = RequestReader::new(stream.as_bytes()).collect();
        let expected = vector["items"].as_array().unwrap();
        assert_eq!(got.len(), expected.len(), "{name}: {got:?}");
        for (got, expected) in got.iter().zip(expected) {
            if let Some(request) = expected.get("request") {
                let request: Request = serde_json::from_value(request.clone()).unwrap();
                assert_eq!(got, &Ok(Decoded::Request(request)), "{name}");
            } else if let Some(id) = expected.get("invalid") {
                match got {
                    Ok(Decoded::Invalid { id: got_id, .. }) => {
                        assert_eq!(got_id.as_deref(), id.as_str(), "{name}")
                    }
                    other => panic!("{name}: expected an invalid request, got {other:?}"),
                }
            } else {
                let fragment = expected["fatal"].as_str().unwrap();
                let err = got.as_ref().expect_err(name);
                assert!(err.message.contains(fragment), "{name}: {}", err.message);
            }
        }
    }
}

#[test]
fn responses_encode_as_documented() {
    for vector in load("responses.json") {
        let response: Response = serde_json::from_value(vector["response"].clone()).unwrap();
        let line = vector["line"].as_str().unwrap();
        assert_eq!(encode_response(&response), format!("{line}\n"));
    }
}
