"""Runs one operation script against a server through kazoo and records everything a client can
observe: results, errors, stats (apart from zxids and times) and watch events."""

import threading
import time

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.protocol.states import ZnodeStat


def norm(value):
    if isinstance(value, ZnodeStat):
        return {
            "version": value.version,
            "cversion": value.cversion,
            "aversion": value.aversion,
            "ephemeral": value.ephemeralOwner != 0,
            "dataLength": value.dataLength,
            "numChildren": value.numChildren,
        }
    if isinstance(value, Exception):
        return type(value).__name__
    if isinstance(value, tuple):
        return tuple(norm(v) for v in value)
    if isinstance(value, list):
        return [norm(v) for v in value]
    return value


class Recorder:
    """`auth`: per client, the (scheme, credentials) it authenticates with at connect."""

    def __init__(self, hosts, clients=1, auth=None):
        auth = auth or [None] * clients
        self.clients = [KazooClient(hosts=hosts, timeout=10, auth_data=auth[i]) for i in range(clients)]
        for c in self.clients:
            c.start(timeout=15)
        self.log = []
        self.events = []
        self._lock = threading.Lock()

    def watcher(self, tag):
        def on_event(event):
            with self._lock:
                self.events.append((tag, event.type, event.path))
        return on_event

    def call(self, label, fn, *args, **kwargs):
        try:
            result = fn(*args, **kwargs)
        except KazooException as e:
            result = e
        if label.startswith("get_children"):
            # ZooKeeper lists children in hash order; only the set is specified.
            if isinstance(result, list):
                result = sorted(result)
            elif isinstance(result, tuple):
                result = (sorted(result[0]), *result[1:])
        self.log.append((label, norm(result)))
        return result

    def settle(self):
        """Waits until every event the operations so far fired has been delivered."""
        for c in self.clients:
            if c.connected:
                c.sync("/")
        time.sleep(0.2)

    def result(self):
        self.settle()
        with self._lock:
            return self.log, group_events(self.events)

    def close(self, index=None):
        targets = self.clients if index is None else [self.clients[index]]
        for c in targets:
            if c.connected:
                c.stop()
                c.close()


def group_events(events):
    """One server event reaches every kazoo watcher of its path, in the order of a Python set:
    events are compared per server event, with the set of watchers that received it."""
    grouped = []
    for tag, etype, path in events:
        if grouped and grouped[-1][0] == (etype, path) and tag not in grouped[-1][1]:
            grouped[-1][1].add(tag)
        else:
            grouped.append(((etype, path), {tag}))
    return [(key, sorted(tags)) for key, tags in grouped]
