"""lavinpyctl's cluster commands that talk to etcd itself: when no node leads there is no management
API to ask (followers answer 503), so an operator's decision goes straight to the coordination store."""

from __future__ import annotations

import asyncio
import json

from ..cluster.etcd import EtcdClient, EtcdError
from ..cluster.keys import ClusterKeys
from ..cluster.tls import ClusterTLSError, etcd_context


class ClusterCtlError(Exception):
    pass


def force_leader(endpoints: str, prefix: str, node_id: str, user: str = "", password: str = "",
                 tls_files: tuple[str, str, str] = ("", "", ""), key_password: str = "") -> str:
    """Let ``node_id`` take the leadership whatever the ISR says (it must be a live member). The node
    consumes the key when it wins. Returns what was done, for the operator. ``tls_files``: etcd's CA,
    a client certificate and its key (any of them set: TLS to etcd)."""
    return asyncio.run(_force_leader(endpoints, prefix, node_id, user, password, tls_files, key_password))


async def _force_leader(endpoints: str, prefix: str, node_id: str, user: str, password: str,
                        tls_files: tuple[str, str, str], key_password: str) -> str:
    keys = ClusterKeys(prefix)
    try:
        tls = etcd_context(*tls_files, key_password) if any(tls_files) else None
    except ClusterTLSError as e:
        raise ClusterCtlError(str(e)) from None
    etcd = EtcdClient(endpoints, user=user, password=password, tls=tls)
    try:
        live = {kv.key.rsplit("/", 1)[1] for kv in await etcd.get_prefix(keys.nodes)}
        if node_id not in live:
            names = ", ".join(sorted(live)) or "none"
            raise ClusterCtlError(f"no live node {node_id!r} under {keys.prefix}/ (live: {names})")
        await etcd.put(keys.force_leader, node_id)
        leader = await etcd.get(keys.leader)
        isr = await etcd.get(keys.isr)
    except EtcdError as e:
        raise ClusterCtlError(f"etcd: {e}") from None
    finally:
        await etcd.close()
    members = json.loads(isr.value) if isr is not None else None
    note = (f"; the current leader ({leader.text}) keeps leading until it stops" if leader is not None
            else "; it takes over at its next election round")
    return f"node {node_id} may now lead whatever the ISR says (ISR in etcd: {members}){note}"
