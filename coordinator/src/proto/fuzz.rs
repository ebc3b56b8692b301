//! Bounded fuzzing of what the coordinator decodes from the network: client requests (jute)
//! and peer messages (bincode behind the peers' MAC). Runs in CI with a fixed seed, so a
//! failure reproduces; `MERGESTREAM_FUZZ_ITERATIONS` runs longer. An input that once broke a
//! decoder belongs in `regressions` below.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::codes::op;
use super::jute::{JuteReader, JuteWriter};
use super::records::{ConnectRequest, Request};
use crate::raft::network::PeerRequest;
use crate::tree::command::{Command, TreeOp};

fn iterations() -> usize {
    std::env::var("MERGESTREAM_FUZZ_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000)
}

/// Valid request bodies of the main ops, as a client sends them after the header.
fn seeds() -> Vec<(i32, Vec<u8>)> {
    let frame = |build: &dyn Fn(&mut JuteWriter)| {
        let mut w = JuteWriter::new();
        build(&mut w);
        w.finish()[4..].to_vec()
    };
    vec![
        (
            op::GET_DATA,
            frame(&|w| {
                w.string("/a/b").bool(true);
            }),
        ),
        (
            op::CREATE,
            frame(&|w| {
                w.string("/a").buffer(b"data").i32(1).i32(31).string("world").string("anyone").i32(0);
            }),
        ),
        (
            op::SET_DATA,
            frame(&|w| {
                w.string("/a").buffer(&[7; 40]).i32(-1);
            }),
        ),
        (
            op::GET_CHILDREN2,
            frame(&|w| {
                w.string("/").bool(false);
            }),
        ),
        (
            op::SET_WATCHES,
            frame(&|w| {
                w.i64(5).strings(&["/a"]).strings(&["/b", "/c"]).strings(&[] as &[&str]);
            }),
        ),
        (
            op::MULTI,
            frame(&|w| {
                w.i32(op::CHECK).bool(false).i32(-1).string("/a").i32(3);
                w.i32(op::DELETE).bool(false).i32(-1).string("/b").i32(-1);
                w.i32(-1).bool(true).i32(-1);
            }),
        ),
    ]
}

fn mutate(rng: &mut StdRng, seed: &[u8]) -> Vec<u8> {
    let mut bytes = seed.to_vec();
    match rng.gen_range(0..4) {
        0 => bytes = (0..rng.gen_range(0..64)).map(|_| rng.gen()).collect(),
        1 if !bytes.is_empty() => {
            let cut = rng.gen_range(0..bytes.len());
            bytes.truncate(cut);
        }
        _ => {
            for _ in 0..rng.gen_range(1..6) {
                if bytes.is_empty() {
                    break;
                }
                let at = rng.gen_range(0..bytes.len());
                bytes[at] = if rng.gen_bool(0.3) { 0x7f } else { rng.gen() };
            }
        }
    }
    bytes
}

#[test]
fn client_requests_decode_or_fail_without_panicking() {
    let mut rng = StdRng::seed_from_u64(15);
    let seeds = seeds();
    let ops = [op::CREATE, op::GET_DATA, op::SET_DATA, op::MULTI, op::SET_WATCHES, op::ADD_WATCH, op::CHECK, 999];
    for _ in 0..iterations() {
        let (seed_op, seed) = &seeds[rng.gen_range(0..seeds.len())];
        let op_code = if rng.gen_bool(0.8) { *seed_op } else { ops[rng.gen_range(0..ops.len())] };
        let bytes = mutate(&mut rng, seed);
        let _ = Request::decode(op_code, &mut JuteReader::new(&bytes));
        let _ = ConnectRequest::decode(&bytes);
    }
}

#[test]
fn peer_messages_decode_or_fail_without_panicking() {
    let command = Command::Batch(vec![
        Command::CreateSession { session_id: 1, timeout_ms: 4000, password: vec![1; 16] },
        Command::Ops {
            session_id: 1,
            time_ms: 5,
            multi: true,
            ops: vec![
                TreeOp::Create { path: "/x".into(), data: Some(b"abc".to_vec()), acl: vec![], flags: 0 },
                TreeOp::Delete { path: "/y".into(), version: -1 },
            ],
        },
        Command::CloseSession { session_id: 1 },
    ]);
    let seeds = [
        bincode::serialize(&PeerRequest::Write(command)).expect("encode"),
        bincode::serialize(&PeerRequest::TouchSessions(vec![1, 2, 3])).expect("encode"),
        bincode::serialize(&PeerRequest::ReadIndex).expect("encode"),
    ];
    let mut rng = StdRng::seed_from_u64(16);
    for _ in 0..iterations() {
        let seed = &seeds[rng.gen_range(0..seeds.len())];
        let bytes = mutate(&mut rng, seed);
        if let Ok(PeerRequest::Write(command)) = bincode::deserialize::<PeerRequest>(&bytes) {
            let _ = command.check();
        }
    }
}

/// Inputs that once broke a decoder.
#[test]
fn regressions() {
    // A Batch nested 200,000 deep once overflowed the stack of a node's peer task.
    let mut nested = 3u32.to_le_bytes().to_vec();
    for _ in 0..200_000 {
        nested.extend_from_slice(&3u32.to_le_bytes());
        nested.extend_from_slice(&1u64.to_le_bytes());
    }
    nested.extend_from_slice(&1u32.to_le_bytes());
    nested.extend_from_slice(&7i64.to_le_bytes());
    assert!(bincode::deserialize::<PeerRequest>(&nested).is_err());
}
