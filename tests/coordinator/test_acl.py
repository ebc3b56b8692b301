"""ACLs against Apache ZooKeeper 3.8: the same scripts, by clients with and without digest
credentials, must meet the same NOAUTH, INVALIDACL, AUTHFAILED and redactions on both. A
ClickHouse-style `<identity>` (a digest user whose nodes are `auth`-only) keeps another
tenant out."""

import struct

from kazoo.exceptions import AuthFailedError
from kazoo.security import ACL, Id, make_acl, make_digest_acl

from rawzk import RawClient, jstring
from test_compat import both

ANN = [("digest", "ann:pw")]
BOB = [("digest", "bob:pw2")]
ANN_ALL = make_digest_acl("ann", "pw", all=True)


def checked(client, path):
    """A multi of one check and one create: the check needs READ."""
    transaction = client.transaction()
    transaction.check(path, 0)
    transaction.create(path + "_m", b"")
    return transaction.commit()


def test_digest_acls_keep_other_clients_out(zookeeper, coordinator, prefix):
    def script(r):
        ann, anon, bob = r.clients
        r.call("create root", ann.create, prefix, b"open")
        r.call("create private", ann.create, f"{prefix}/p", b"secret", acl=[ANN_ALL])
        for who, c in (("anon", anon), ("bob", bob), ("ann", ann)):
            r.call(f"{who} exists", c.exists, f"{prefix}/p")
            r.call(f"{who} get", c.get, f"{prefix}/p")
            r.call(f"{who} children", c.get_children, f"{prefix}/p")
            r.call(f"{who} acls", c.get_acls, f"{prefix}/p")
            r.call(f"{who} set", c.set, f"{prefix}/p", who.encode())
            r.call(f"{who} create child", c.create, f"{prefix}/p/{who}", b"")
            r.call(f"{who} multi check", checked, c, f"{prefix}/p")
        r.call("bob set acl", bob.set_acls, f"{prefix}/p", [make_acl("world", "anyone", all=True)])
        r.call("ann delete child", ann.delete, f"{prefix}/p/ann")
        # Deleting needs DELETE on the parent, which is open here.
        r.call("anon delete private", anon.delete, f"{prefix}/p")

    both(zookeeper, coordinator, script, clients=3, auth=[ANN, None, BOB])


def test_acl_validation_auth_scheme_redaction_and_versions(zookeeper, coordinator, prefix):
    def script(r):
        ann, anon = r.clients
        r.call("create root", ann.create, prefix, b"")
        r.call("auth by ann", ann.create, f"{prefix}/a", b"", acl=[make_acl("auth", "", all=True)])
        r.call("acls of auth node", ann.get_acls, f"{prefix}/a")
        r.call("auth by anon", anon.create, f"{prefix}/b", b"", acl=[make_acl("auth", "", all=True)])
        for label, acl in (("bad scheme", make_acl("nope", "x", all=True)),
                           ("world someone", make_acl("world", "someone", all=True)),
                           ("bad ip", make_acl("ip", "300.1.1.1", all=True)),
                           ("bad digest", make_acl("digest", "nocolon", all=True))):
            r.call(label, ann.create, f"{prefix}/bad", b"", acl=[acl])
        r.call("ip network", ann.create, f"{prefix}/ip", b"x", acl=[make_acl("ip", "127.0.0.0/8", all=True)])
        r.call("anon reads ip node", anon.get, f"{prefix}/ip")
        r.call("other network", ann.create, f"{prefix}/ip10", b"x", acl=[make_acl("ip", "10.0.0.0/8", all=True)])
        r.call("anon reads other network", anon.get, f"{prefix}/ip10")
        readable = [make_acl("digest", ANN_ALL.id.id, read=True), make_acl("world", "anyone", read=True)]
        r.call("read only", ann.create, f"{prefix}/r", b"", acl=readable)
        r.call("redacted for ann", ann.get_acls, f"{prefix}/r")
        r.call("redacted for anon", anon.get_acls, f"{prefix}/r")
        r.call("no perms", ann.create, f"{prefix}/z", b"", acl=[make_acl("world", "anyone")])
        r.call("get no perms", ann.get, f"{prefix}/z")
        r.call("acls no perms", ann.get_acls, f"{prefix}/z")
        r.call("set acl bad version", ann.set_acls, f"{prefix}/a", [make_acl("world", "anyone", all=True)], 5)
        r.call("set acl", ann.set_acls, f"{prefix}/a", [make_acl("world", "anyone", all=True)], 0)
        r.call("anon reads opened", anon.get, f"{prefix}/a")
        r.call("set acl invalid", ann.set_acls, f"{prefix}/a", [make_acl("nope", "x", all=True)])
        r.call("set acl missing", ann.set_acls, f"{prefix}/missing", [make_acl("world", "anyone", all=True)])

    both(zookeeper, coordinator, script, clients=2, auth=[ANN, None])


def raw_create(client, path, acl):
    """A create with exactly this ACL list (kazoo replaces an empty one by its default)."""
    body = jstring(path) + struct.pack(">i", -1) + struct.pack(">i", len(acl))
    for perms, scheme, ident in acl:
        body += struct.pack(">i", perms) + jstring(scheme) + jstring(ident)
    return client.request(1, body + struct.pack(">i", 0))


def test_an_empty_acl_is_invalid_and_an_unknown_scheme_fails_authentication(zookeeper, coordinator, prefix):
    outcomes = []
    for server in (zookeeper, coordinator):
        raw = RawClient(getattr(server, "port", None) or server.client_port)
        try:
            empty = raw_create(raw, f"{prefix}_empty", [])[0]
            ok = raw_create(raw, f"{prefix}_ok", [(31, "world", "anyone")])[0]
            outcomes.append((empty, ok))
        finally:
            raw.close()
    assert outcomes[0] == outcomes[1] == (-114, 0), outcomes

    for server in (zookeeper, coordinator):
        from kazoo.client import KazooClient
        client = KazooClient(hosts=server.hosts, timeout=5)
        client.start(10)
        try:
            try:
                client.add_auth("kerberos", "x")
                raise AssertionError("an unknown scheme was accepted")
            except AuthFailedError:
                pass
        finally:
            client.stop()
            client.close()


def test_an_auth_reply_carries_the_requests_own_xid(zookeeper, coordinator):
    """ZooKeeper answers addauth with the request's xid (and zxid 0), whatever the xid is:
    zookeeper-client sends auth with an ordinary xid and waits for that one."""
    replies = []
    for server in (zookeeper, coordinator):
        raw = RawClient(getattr(server, "port", None) or server.client_port)
        try:
            credentials = b"ann:pw"
            body = struct.pack(">i", 0) + jstring("digest") + struct.pack(">i", len(credentials)) + credentials
            raw.send_frame(struct.pack(">ii", 7, 100) + body)
            xid, zxid, err = struct.unpack_from(">iqi", raw.read_frame())
            replies.append((xid, zxid, err))
        finally:
            raw.close()
    assert replies[0] == replies[1] == (7, 0, 0), replies
