//! Encoding of replies: the reply header, then the body of the request type.

use crate::proto::codes::{op, ErrorCode};
use crate::proto::jute::JuteWriter;
use crate::proto::records::Stat;
use crate::tree::command::{CommandResult, OpResult};

pub fn header(xid: i32, zxid: i64, err: ErrorCode) -> JuteWriter {
    let mut w = JuteWriter::new();
    w.i32(xid).i64(zxid).i32(err.code());
    w
}

pub fn error(xid: i32, zxid: i64, err: ErrorCode) -> Vec<u8> {
    header(xid, zxid, err).finish()
}

pub fn empty(xid: i32, zxid: i64) -> Vec<u8> {
    header(xid, zxid, ErrorCode::Ok).finish()
}

pub fn stat(xid: i32, zxid: i64, stat: &Stat) -> Vec<u8> {
    let mut w = header(xid, zxid, ErrorCode::Ok);
    stat.write(&mut w);
    w.finish()
}

/// The reply to a write request (`op_code` is the request's), from what applying it returned.
pub fn write_result(xid: i32, zxid: i64, op_code: i32, multi_ops: &[i32], result: &CommandResult) -> Vec<u8> {
    match result {
        CommandResult::Failed(code) => error(xid, zxid, *code),
        CommandResult::MultiFailed(codes) => {
            // The header says OK: the per-operation entries carry the failure, as in ZooKeeper.
            let mut w = header(xid, zxid, ErrorCode::Ok);
            for code in codes {
                w.i32(op::ERROR).bool(false).i32(code.code()).i32(code.code());
            }
            w.i32(-1).bool(true).i32(-1);
            w.finish()
        }
        CommandResult::Applied(results) if op_code == op::MULTI => {
            let mut w = header(xid, zxid, ErrorCode::Ok);
            for (result, op_type) in results.iter().zip(multi_ops) {
                w.i32(*op_type).bool(false).i32(0);
                write_op_result(&mut w, *op_type, result);
            }
            w.i32(-1).bool(true).i32(-1);
            w.finish()
        }
        CommandResult::Applied(results) => {
            let mut w = header(xid, zxid, ErrorCode::Ok);
            if let Some(r) = results.first() {
                write_op_result(&mut w, op_code, r);
            }
            w.finish()
        }
        // A batch is split into its commands' results before anything is answered.
        CommandResult::SessionCreated | CommandResult::SessionClosed | CommandResult::Batch(_) => empty(xid, zxid),
    }
}

fn write_op_result(w: &mut JuteWriter, op_code: i32, result: &OpResult) {
    match result {
        OpResult::Created { path, stat } => {
            w.string(path);
            if op_code == op::CREATE2 {
                stat.write(w);
            }
        }
        OpResult::SetData { stat } | OpResult::SetAcl { stat } => stat.write(w),
        OpResult::Deleted | OpResult::Checked => {}
    }
}
