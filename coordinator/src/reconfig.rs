//! ZooKeeper's dynamic reconfiguration (`reconfig`, op 16): the ensemble as `/zookeeper/config`
//! lists it, changed by adding, removing or replacing members. A participant is a Raft voter,
//! an observer a learner (it follows the log and does not vote); a member's quorum address is
//! its Raft address, which is all Raft needs of it. The new list is written to
//! `/zookeeper/config` by the same command stream as every other write, its version the zxid
//! of that write, as ZooKeeper writes it.

use std::collections::BTreeMap;
use std::fmt;

use crate::acl::{self, perms, AuthId};
use crate::node::Coordinator;
use crate::proto::codes::ErrorCode;
use crate::proto::records::Stat;
use crate::raft::network::{PeerRequest, PeerResponse};
use crate::raft::{Node, NodeId};
use crate::tree::command::{Command, TreeOp};
use crate::tree::CONFIG_NODE;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Participant,
    Observer,
}

/// One `server.ID=HOST:QUORUM_PORT:ELECTION_PORT[:ROLE][;[CLIENT_HOST:]CLIENT_PORT]` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    pub host: String,
    pub quorum_port: u16,
    pub election_port: u16,
    pub role: Role,
    /// `None` for members this node knows only from Raft's membership (their Raft address).
    pub client: Option<(String, u16)>,
}

impl Member {
    /// The address Raft reaches the member at.
    pub fn raft_addr(&self) -> String {
        format!("{}:{}", self.host, self.quorum_port)
    }

    /// A member as Raft knows it: its address, no client port.
    pub fn from_raft(id: u64, addr: &str, role: Role) -> Option<Member> {
        let (host, port) = addr.rsplit_once(':')?;
        let port = port.parse().ok()?;
        Some(Member { id, host: host.to_string(), quorum_port: port, election_port: port, role, client: None })
    }

    /// Parses `server.ID=SPEC`; `joining` requires the client port, as ZooKeeper does of a
    /// joining server ("each server should have 3 ports specified").
    pub fn parse(line: &str, joining: bool) -> Result<Member, String> {
        let (key, spec) = line.trim().split_once('=').ok_or_else(|| format!("{line:?} is not server.ID=SPEC"))?;
        let id = key
            .trim()
            .strip_prefix("server.")
            .and_then(|id| id.parse::<u64>().ok())
            .ok_or_else(|| format!("{key:?} is not server.ID"))?;
        let (server, client) = match spec.trim().split_once(';') {
            Some((server, client)) => (server, Some(client)),
            None => (spec.trim(), None),
        };
        let mut parts = server.split(':');
        let host = parts.next().filter(|h| !h.is_empty()).ok_or_else(|| format!("{spec:?} names no host"))?;
        let port = |p: Option<&str>, what: &str| {
            p.and_then(|p| p.parse::<u16>().ok()).ok_or_else(|| format!("{spec:?} has no valid {what} port"))
        };
        let quorum_port = port(parts.next(), "quorum")?;
        let election_port = port(parts.next(), "election")?;
        let role = match parts.next() {
            None | Some("participant") => Role::Participant,
            Some("observer") => Role::Observer,
            Some(other) => return Err(format!("{other:?} is not participant or observer")),
        };
        if parts.next().is_some() {
            return Err(format!("{spec:?} has too many fields"));
        }
        let client = match client {
            None if joining => return Err(format!("{line:?} gives no client port")),
            None => None,
            Some(client) => Some(match client.rsplit_once(':') {
                Some((host, p)) => (host.to_string(), port(Some(p), "client")?),
                None => ("0.0.0.0".to_string(), port(Some(client), "client")?),
            }),
        };
        Ok(Member { id, host: host.to_string(), quorum_port, election_port, role, client })
    }
}

impl fmt::Display for Member {
    /// As ZooKeeper's QuorumServer prints itself.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let role = match self.role {
            Role::Participant => "participant",
            Role::Observer => "observer",
        };
        write!(f, "{}:{}:{}:{role}", self.host, self.quorum_port, self.election_port)?;
        if let Some((host, port)) = &self.client {
            write!(f, ";{host}:{port}")?;
        }
        Ok(())
    }
}

/// What a client asked for: members to add or replace and ids to remove, or a whole new list.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReconfigRequest {
    pub joining: Option<String>,
    pub leaving: Option<String>,
    pub new_members: Option<String>,
    /// The version the change is made from; -1 for any.
    pub from_config: i64,
}

/// The ensemble after `request`, from `current`; BADARGUMENTS for what ZooKeeper refuses so.
pub fn next_members(
    current: &BTreeMap<u64, Member>,
    request: &ReconfigRequest,
) -> Result<BTreeMap<u64, Member>, ErrorCode> {
    let bad = |reason: String| {
        tracing::debug!(reason, "reconfig refused");
        ErrorCode::BadArguments
    };
    let split = |list: &str| -> Vec<String> {
        list.split([',', '\n']).map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()
    };
    let next = match &request.new_members {
        Some(list) => {
            let mut next = BTreeMap::new();
            for line in split(list).into_iter().filter(|l| !l.starts_with("version=")) {
                let member = Member::parse(&line, true).map_err(bad)?;
                next.insert(member.id, member);
            }
            next
        }
        None => {
            let mut next = current.clone();
            for id in request.leaving.as_deref().map(split).into_iter().flatten() {
                let id = id.parse::<u64>().map_err(|_| bad(format!("{id:?} is not a server id")))?;
                next.remove(&id);
            }
            for line in request.joining.as_deref().map(split).into_iter().flatten() {
                let member = Member::parse(&line, true).map_err(bad)?;
                next.insert(member.id, member);
            }
            next
        }
    };
    if !next.values().any(|m| m.role == Role::Participant) {
        return Err(bad("the new configuration has no participant".into()));
    }
    Ok(next)
}

/// The members `/zookeeper/config` lists (its `version=` line left out).
pub fn parse_config(text: &str) -> BTreeMap<u64, Member> {
    text.lines()
        .filter(|l| l.starts_with("server."))
        .filter_map(|l| Member::parse(l, false).ok())
        .map(|m| (m.id, m))
        .collect()
}

/// `/zookeeper/config` without its version line, which the write adds with its own zxid.
pub fn render(members: &BTreeMap<u64, Member>) -> String {
    members.values().map(|m| format!("server.{}={m}\n", m.id)).collect()
}

/// How long a membership change may take: a joining participant must catch up with the log
/// before it votes.
const MEMBERSHIP_CHANGE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// One membership change, bounded; NEWCONFIGNOQUORUM when Raft cannot make it (a joining
/// participant that is not reachable, say).
async fn within<T, E: fmt::Display>(
    what: &str,
    change: impl std::future::Future<Output = Result<T, E>>,
) -> Result<(), ErrorCode> {
    let error = match tokio::time::timeout(MEMBERSHIP_CHANGE_TIMEOUT, change).await {
        Ok(Ok(_)) => return Ok(()),
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("not done in {MEMBERSHIP_CHANGE_TIMEOUT:?}"),
    };
    tracing::warn!(what, error, "reconfig: a membership change failed");
    Err(ErrorCode::NewConfigNoQuorum)
}

impl Coordinator {
    /// Runs a client's reconfig on the leader (forwarded there from any node) and answers with
    /// `/zookeeper/config`'s new data and stat.
    pub async fn reconfigure(&self, request: ReconfigRequest, auth: Vec<AuthId>) -> Result<(Vec<u8>, Stat), ErrorCode> {
        if self.is_leader() {
            return self.reconfigure_here(&request, &auth).await;
        }
        let leader = {
            let metrics = self.raft.metrics().borrow().clone();
            let leader = metrics.current_leader.ok_or(ErrorCode::NewConfigNoQuorum)?;
            metrics.membership_config.membership().get_node(&leader).map(|n| n.addr.clone())
        };
        let addr = leader.ok_or(ErrorCode::NewConfigNoQuorum)?;
        match self.pool.call(&addr, &PeerRequest::Reconfig { request, auth }, MEMBERSHIP_CHANGE_TIMEOUT).await {
            Ok(PeerResponse::Reconfig(result)) => result,
            Ok(other) => {
                tracing::warn!(?other, "unexpected answer to a forwarded reconfig");
                Err(ErrorCode::SystemError)
            }
            Err(e) => {
                tracing::warn!(error = %e, "forwarding a reconfig to the leader failed");
                Err(ErrorCode::NewConfigNoQuorum)
            }
        }
    }

    pub(crate) async fn reconfigure_here(
        &self,
        request: &ReconfigRequest,
        auth: &[AuthId],
    ) -> Result<(Vec<u8>, Stat), ErrorCode> {
        let Ok(_one_at_a_time) = self.reconfiguring.try_lock() else { return Err(ErrorCode::ReconfigInProgress) };
        let (text, version, config_acl) = {
            let inner = self.state.lock();
            let node = inner.tree.node(CONFIG_NODE).ok_or(ErrorCode::NoNode)?;
            (
                String::from_utf8_lossy(node.data.as_deref().unwrap_or_default()).into_owned(),
                node.mzxid,
                node.acl.clone(),
            )
        };
        // ZooKeeper's order: the version, then the request's own sense, then the ACL.
        if request.from_config != -1 && request.from_config != version {
            return Err(ErrorCode::BadVersion);
        }
        let membership = self.raft.metrics().borrow().membership_config.membership().clone();
        let mut current = parse_config(&text);
        if current.is_empty() {
            // Until the first reconfig, the ensemble is what Raft knows of it.
            let voters: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
            for (id, node) in membership.nodes() {
                let role = if voters.contains(id) { Role::Participant } else { Role::Observer };
                if let Some(member) = Member::from_raft(*id, &node.addr, role) {
                    current.insert(*id, member);
                }
            }
        }
        let next = next_members(&current, request)?;
        if !acl::permits(&config_acl, auth, perms::WRITE) {
            return Err(ErrorCode::NoAuth);
        }
        self.change_membership(&membership, &next).await?;
        let time_ms =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        let ops = vec![TreeOp::SetConfig { members: render(&next) }];
        let committed = self
            .write(Command::Ops { session_id: 0, time_ms, multi: false, ops })
            .await
            .map_err(|_| ErrorCode::NewConfigNoQuorum)?;
        self.state.wait_applied(committed.index).await;
        let inner = self.state.lock();
        let node = inner.tree.node(CONFIG_NODE).ok_or(ErrorCode::NoNode)?;
        tracing::info!(config = %String::from_utf8_lossy(node.data.as_deref().unwrap_or_default()), "reconfigured");
        Ok((node.data.clone().unwrap_or_default(), node.stat()))
    }

    /// Makes Raft's membership `next`: new members join as learners (a participant once it
    /// caught up), then the voters become `next`'s participants, then members no longer
    /// listed leave.
    async fn change_membership(
        &self,
        membership: &openraft::Membership<NodeId, Node>,
        next: &BTreeMap<u64, Member>,
    ) -> Result<(), ErrorCode> {
        for member in next.values() {
            let known = membership.get_node(&member.id).is_some_and(|n| n.addr == member.raft_addr());
            if !known {
                let node = Node { addr: member.raft_addr() };
                let blocking = member.role == Role::Participant;
                within("add a learner", self.raft.add_learner(member.id, node, blocking)).await?;
            }
        }
        let voters: std::collections::BTreeSet<u64> =
            next.values().filter(|m| m.role == Role::Participant).map(|m| m.id).collect();
        if voters != membership.voter_ids().collect() {
            // Voters that become observers stay as learners.
            within("change the voters", self.raft.change_membership(voters, true)).await?;
        }
        let now = self.raft.metrics().borrow().membership_config.membership().clone();
        let leaving: std::collections::BTreeSet<u64> =
            now.nodes().map(|(id, _)| *id).filter(|id| !next.contains_key(id)).collect();
        if !leaving.is_empty() {
            let removal = openraft::ChangeMembers::RemoveNodes(leaving);
            within("remove members", self.raft.change_membership(removal, false)).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(joining: Option<&str>, leaving: Option<&str>) -> ReconfigRequest {
        ReconfigRequest {
            joining: joining.map(Into::into),
            leaving: leaving.map(Into::into),
            new_members: None,
            from_config: -1,
        }
    }

    #[test]
    fn members_print_as_zookeeper_prints_them() {
        let line = "server.100=0.0.0.0:2888:3888:observer;0.0.0.0:2181";
        let member = Member::parse(line, true).expect("valid");
        assert_eq!((member.id, member.role, member.quorum_port), (100, Role::Observer, 2888));
        assert_eq!(format!("server.{}={member}", member.id), line);
        let bare = Member::parse("server.2=h:1:2;2181", true).expect("valid");
        assert_eq!(bare.to_string(), "h:1:2:participant;0.0.0.0:2181");
        assert_eq!(
            Member::from_raft(1, "127.0.0.1:9234", Role::Participant).expect("addr").to_string(),
            "127.0.0.1:9234:9234:participant"
        );
        for bad in ["some thing", "server.x=h:1:2;3", "server.1=h:1;3", "server.1=h:1:2:boss;3", "server.1=h:1:2"] {
            assert!(Member::parse(bad, true).is_err(), "{bad}");
        }
    }

    #[test]
    fn incremental_and_whole_changes() {
        let current = parse_config("server.1=a:1:1:participant\nserver.2=b:2:2:participant\nversion=0");
        let joined = next_members(&current, &request(Some("server.3=c:3:3:observer;c:30"), None)).expect("valid");
        assert_eq!(joined.len(), 3);
        assert_eq!(render(&joined).lines().last(), Some("server.3=c:3:3:observer;c:30"));
        let left = next_members(&joined, &request(None, Some("3,1"))).expect("valid");
        assert_eq!(left.keys().copied().collect::<Vec<_>>(), vec![2]);
        assert_eq!(next_members(&current, &request(Some("some thing"), None)), Err(ErrorCode::BadArguments));
        assert_eq!(next_members(&current, &request(None, Some("1,2"))), Err(ErrorCode::BadArguments));
        let whole = ReconfigRequest { new_members: Some("server.5=e:5:5;50\nversion=1".into()), ..request(None, None) };
        assert_eq!(next_members(&current, &whole).expect("valid").keys().copied().collect::<Vec<_>>(), vec![5]);
    }
}
