use super::command::{Change, Command, CommandResult, OpResult, TreeOp};
use super::*;

fn create(path: &str, flags: i32) -> TreeOp {
    TreeOp::Create { path: path.into(), data: Some(b"d".to_vec()), acl: open_acl(), flags }
}

struct Harness {
    tree: DataTree,
    zxid: i64,
    changes: Vec<Change>,
}

impl Harness {
    fn new() -> Self {
        let mut h = Self { tree: DataTree::new(), zxid: 0, changes: Vec::new() };
        h.run(Command::CreateSession { session_id: 7, timeout_ms: 10_000, password: vec![1; 16] });
        h
    }

    fn run(&mut self, command: Command) -> CommandResult {
        self.zxid += 1;
        self.tree.apply(self.zxid, &command, &mut self.changes)
    }

    fn op(&mut self, op: TreeOp) -> CommandResult {
        self.run(Command::Ops { session_id: 7, time_ms: 1000, multi: false, ops: vec![op] })
    }

    fn stat(&self, path: &str) -> Stat {
        self.tree.node(path).map(Znode::stat).unwrap_or_default()
    }
}

#[test]
fn fresh_tree_reports_the_stats_zookeeper_3_8_reports() {
    let h = Harness::new();
    assert_eq!((h.stat("/").cversion, h.stat("/").num_children), (-1, 1));
    assert_eq!((h.stat("/zookeeper").cversion, h.stat("/zookeeper").num_children), (-2, 2));
}

#[test]
fn sequence_numbers_count_creates_and_cversion_counts_creates_and_deletes() {
    // The figures are what ZooKeeper 3.8 returned for the same sequence.
    let mut h = Harness::new();
    h.op(create("/p", 0));
    h.op(create("/p/b", 0));
    h.op(TreeOp::Delete { path: "/p/b".into(), version: -1 });
    assert_eq!(h.stat("/p").cversion, 2);
    let CommandResult::Applied(r) = h.op(create("/p/s", 2)) else { panic!("create failed") };
    assert!(matches!(&r[0], OpResult::Created { path, .. } if path == "/p/s0000000001"));
    assert_eq!(h.stat("/p").cversion, 3);
    h.op(create("/p/s", 2));
    h.op(TreeOp::Delete { path: "/p/s0000000001".into(), version: -1 });
    assert_eq!(h.stat("/p").cversion, 5);
    let CommandResult::Applied(r) = h.op(create("/p/s", 2)) else { panic!("create failed") };
    assert!(matches!(&r[0], OpResult::Created { path, .. } if path == "/p/s0000000003"));
}

#[test]
fn failed_multi_changes_nothing_and_reports_codes_per_operation() {
    let mut h = Harness::new();
    h.op(create("/a", 0));
    let before = h.tree.clone();
    h.changes.clear();
    let result = h.run(Command::Ops {
        session_id: 7,
        time_ms: 5,
        multi: true,
        ops: vec![
            create("/m1", 1),
            TreeOp::SetData { path: "/a".into(), data: Some(b"new".to_vec()), version: -1 },
            TreeOp::Delete { path: "/a".into(), version: -1 },
            create("/a", 0),
            TreeOp::Check { path: "/a".into(), version: 3 },
            create("/m2", 0),
        ],
    });
    assert_eq!(
        result,
        CommandResult::MultiFailed(vec![
            ErrorCode::Ok,
            ErrorCode::Ok,
            ErrorCode::Ok,
            ErrorCode::Ok,
            ErrorCode::BadVersion,
            ErrorCode::RuntimeInconsistency
        ])
    );
    let mut after = h.tree.clone();
    after.last_zxid = before.last_zxid;
    assert_eq!(after, before);
    assert!(h.changes.is_empty());
}

#[test]
fn closing_a_session_removes_its_ephemerals_and_reports_them() {
    let mut h = Harness::new();
    h.op(create("/e", 1));
    assert_eq!(h.op(create("/e/c", 0)), CommandResult::Failed(ErrorCode::NoChildrenForEphemerals));
    h.changes.clear();
    h.run(Command::CloseSession { session_id: 7 });
    assert!(h.tree.node("/e").is_none());
    assert_eq!(h.changes, vec![Change::Deleted("/e".into())]);
    assert_eq!(h.op(create("/x", 0)), CommandResult::Failed(ErrorCode::SessionExpired));
}

#[test]
fn errors_in_zookeeper_order() {
    let mut h = Harness::new();
    assert_eq!(h.op(create("/x/y", 0)), CommandResult::Failed(ErrorCode::NoNode));
    h.op(create("/a", 0));
    h.op(create("/a/b", 0));
    assert_eq!(h.op(TreeOp::Delete { path: "/a".into(), version: 5 }), CommandResult::Failed(ErrorCode::BadVersion));
    assert_eq!(h.op(TreeOp::Delete { path: "/a".into(), version: 0 }), CommandResult::Failed(ErrorCode::NotEmpty));
    assert_eq!(h.op(TreeOp::Delete { path: "/".into(), version: -1 }), CommandResult::Failed(ErrorCode::BadArguments));
    assert_eq!(
        h.op(TreeOp::Delete { path: "/zookeeper".into(), version: -1 }),
        CommandResult::Failed(ErrorCode::BadArguments)
    );
    assert_eq!(h.op(create("/a", 0)), CommandResult::Failed(ErrorCode::NodeExists));
}

#[test]
fn java_hash_set_order_matches_java() {
    // What Java 17 prints for `((HashSet<String>) set.clone())` iterated, the set built by
    // adding the paths in this order (ZooKeeper 3.8 deletes a closed session's ephemerals so).
    let order = |paths: &[&str]| {
        let created: Vec<String> = paths.iter().map(|p| p.to_string()).collect();
        let at = |p: &String| created.iter().position(|c| c == p).unwrap_or_default() as i64;
        java_hash_set_order(created.clone(), at)
    };
    let p = "/test_ephemerals_go_when_their_session_closes_9";
    // The set itself iterates lock first; its 4-bucket clone, q- first.
    assert_eq!(
        order(&[&format!("{p}/lock"), &format!("{p}/q-0000000001")]),
        [format!("{p}/q-0000000001"), format!("{p}/lock")]
    );
    let p = "/test_ephemerals_go_when_their_session_closes_2";
    assert_eq!(
        order(&[&format!("{p}/lock"), &format!("{p}/q-0000000001")]),
        [format!("{p}/lock"), format!("{p}/q-0000000001")]
    );
    let five = ["/e/n0", "/e/n919", "/e/n838", "/e/n757", "/e/n676"];
    assert_eq!(order(&five), ["/e/n757", "/e/n919", "/e/n676", "/e/n0", "/e/n838"]);
    let thirteen: Vec<String> = (0..13).map(|i| format!("/e/n{}", i * 7919 % 1000)).collect();
    let thirteen: Vec<&str> = thirteen.iter().map(String::as_str).collect();
    assert_eq!(
        order(&thirteen),
        [
            "/e/n28", "/e/n109", "/e/n757", "/e/n514", "/e/n676", "/e/n919", "/e/n838", "/e/n271", "/e/n190",
            "/e/n433", "/e/n595", "/e/n352", "/e/n0"
        ]
    );
}

#[test]
fn a_batch_applies_its_commands_in_order_each_at_its_own_zxid() {
    let mut h = Harness::new();
    let base = super::command::zxid::of(9, 0);
    let one = |op| Command::Ops { session_id: 7, time_ms: 1000, multi: false, ops: vec![op] };
    let batch = Command::Batch(vec![
        one(create("/b", 0)),
        one(create("/b", 0)),
        one(create("/b/c", 0)),
        Command::Ops { session_id: 99, time_ms: 1000, multi: false, ops: vec![create("/x", 0)] },
    ]);
    let CommandResult::Batch(results) = h.tree.apply(base, &batch, &mut h.changes) else {
        panic!("not a batch result")
    };
    assert!(matches!(results[0], CommandResult::Applied(_)));
    assert_eq!(results[1], CommandResult::Failed(ErrorCode::NodeExists));
    assert!(matches!(results[2], CommandResult::Applied(_)));
    // A command of an unknown session fails alone; the others stand.
    assert_eq!(results[3], CommandResult::Failed(ErrorCode::SessionExpired));
    assert_eq!((h.stat("/b").czxid, h.stat("/b/c").czxid, h.stat("/b").pzxid), (base, base + 2, base + 2));
    assert_eq!(h.tree.last_zxid(), base + 3);
    assert_eq!(super::command::zxid::index(base + 3), 9);
}

#[test]
fn operations_with_identities_are_checked_against_the_acls_as_they_apply() {
    use crate::acl::{authenticate, perms, AuthId};
    let mut h = Harness::new();
    let ann = vec![
        AuthId::ip("127.0.0.1".parse().expect("ip")),
        authenticate("digest", b"ann:pw", None).expect("digest").remove(0),
    ];
    let other = vec![AuthId::ip("127.0.0.1".parse().expect("ip"))];
    let as_ = |auth: &Vec<AuthId>, multi: bool, ops: Vec<TreeOp>| Command::OpsAs {
        session_id: 7,
        time_ms: 1000,
        multi,
        ops,
        auth: auth.clone(),
    };
    let only_ann = vec![Acl { perms: perms::ALL, scheme: "auth".into(), id: String::new() }];
    let created = h.run(as_(
        &ann,
        false,
        vec![TreeOp::Create { path: "/p".into(), data: Some(vec![]), acl: only_ann, flags: 0 }],
    ));
    assert!(matches!(created, CommandResult::Applied(_)), "{created:?}");
    assert_eq!(h.tree.node("/p").expect("created").acl[0].id, ann[1].id, "auth became ann's digest");

    let set = |data: &[u8]| TreeOp::SetData { path: "/p".into(), data: Some(data.to_vec()), version: -1 };
    assert_eq!(h.run(as_(&other, false, vec![set(b"x")])), CommandResult::Failed(ErrorCode::NoAuth));
    assert!(matches!(h.run(as_(&ann, false, vec![set(b"x")])), CommandResult::Applied(_)));
    let child = TreeOp::Create { path: "/p/c".into(), data: Some(vec![]), acl: open_acl(), flags: 0 };
    assert_eq!(h.run(as_(&other, false, vec![child.clone()])), CommandResult::Failed(ErrorCode::NoAuth));
    // In a multi the refused operation fails it all.
    let multi = h.run(as_(&other, true, vec![create("/free", 0), TreeOp::Check { path: "/p".into(), version: -1 }]));
    assert_eq!(multi, CommandResult::MultiFailed(vec![ErrorCode::Ok, ErrorCode::NoAuth]));
    assert!(h.tree.node("/free").is_none());
    // An ACL naming nobody the connection is cannot be given by `auth`.
    let unauthenticated = TreeOp::SetAcl {
        path: "/p".into(),
        acl: vec![Acl { perms: perms::ALL, scheme: "auth".into(), id: String::new() }],
        version: -1,
    };
    assert_eq!(h.run(as_(&other, false, vec![unauthenticated])), CommandResult::Failed(ErrorCode::InvalidAcl));
    // Commands from before ACLs were enforced apply unchecked, as they did.
    assert!(matches!(h.op(set(b"old")), CommandResult::Applied(_)));
}

#[test]
fn null_data_is_kept_apart_from_empty_data() {
    let mut h = Harness::new();
    let null = TreeOp::Create { path: "/null".into(), data: None, acl: open_acl(), flags: 0 };
    assert!(matches!(h.op(null), CommandResult::Applied(_)));
    assert_eq!(h.tree.node("/null").map(|n| n.data.clone()), Some(None));
    assert_eq!(h.stat("/null").data_length, 0);
    h.op(TreeOp::SetData { path: "/null".into(), data: Some(Vec::new()), version: -1 });
    assert_eq!(h.tree.node("/null").map(|n| n.data.clone()), Some(Some(Vec::new())));
    // A failed multi puts the null back.
    h.op(TreeOp::SetData { path: "/null".into(), data: None, version: -1 });
    let multi = Command::Ops {
        session_id: 7,
        time_ms: 1000,
        multi: true,
        ops: vec![
            TreeOp::SetData { path: "/null".into(), data: Some(b"x".to_vec()), version: -1 },
            TreeOp::Check { path: "/null".into(), version: 99 },
        ],
    };
    assert!(matches!(h.run(multi), CommandResult::MultiFailed(_)));
    assert_eq!(h.tree.node("/null").map(|n| n.data.clone()), Some(None));
}

#[test]
fn a_tree_in_the_first_snapshot_encoding_loads_unchanged() {
    let mut h = Harness::new();
    h.op(create("/a", 0));
    h.op(create("/a/e", 1));
    let old = bincode::serialize(&v1::DataTree::from_current(&h.tree)).expect("encode");
    let loaded: DataTree = bincode::deserialize::<v1::DataTree>(&old).expect("decode").into();
    assert_eq!(loaded.dump(), h.tree.dump());
    assert_eq!(loaded.ephemeral_count(), 1);
    assert_eq!(loaded.last_zxid(), h.tree.last_zxid());
}

#[test]
fn a_reconfig_writes_the_members_with_its_zxid_as_the_version() {
    let mut h = Harness::new();
    let members = "server.1=a:1:1:participant\n".to_string();
    assert!(matches!(h.op(TreeOp::SetConfig { members }), CommandResult::Applied(_)));
    let node = h.tree.node(CONFIG_NODE).expect("the config node");
    let expected = format!("server.1=a:1:1:participant\nversion={:x}", h.zxid);
    assert_eq!(node.data.as_deref(), Some(expected.as_bytes()));
    assert_eq!((node.mzxid, node.version), (h.zxid, 1));
    // As in ZooKeeper 3.5.3+: anyone reads it, only the superuser could setData it.
    assert_eq!(node.acl, read_only_acl());
}
