"""store/chains.py over a real Index: links from puts and lookups, a leaving block dissolves its subtree into
orphans (exact order), branch points, relocation keeps links, junk cycles terminate."""

import numpy as np

from kvpool.store.chains import MANY, NONE, ORPHAN, ROOT, Chains
from kvpool.store.index import Index, State
from kvpool.tiers.types import Tier


def build(n: int) -> tuple[Index, Chains, list[int]]:
    index = Index()
    slots = [index.add(i.to_bytes(16, "big"), node=0, tier=Tier.DRAM, state=State.COMMITTED, offset=i * 4096,
                       size=4096, ns=0) for i in range(n)]
    return index, Chains(index), slots


def chain(chains: Chains, slots: list[int]) -> None:
    for parent, child in zip(slots, slots[1:]):
        assert chains.link(child, parent) is False


def test_links_and_a_leaving_block_orphans_its_whole_subtree_in_prefix_order():
    index, chains, s = build(6)
    chain(chains, s[:4])                   # 0 -> 1 -> 2 -> 3
    chains.link(s[4], s[1])                # a branch at 1: 1 -> {2, 4}
    assert int(index.child[s[1]]) == MANY and chains.children(s[1]) == [s[2], s[4]] and chains.branch_points == 1
    assert chains.detach(s[1]) == [s[2], s[4], s[3]]     # breadth first: parents before their children
    assert [int(index.parent[x]) for x in s[:5]] == [ROOT, ROOT, ORPHAN, ORPHAN, ORPHAN]
    assert chains.children(s[0]) == [] and chains.branch_points == 0
    assert [int(index.child[x]) for x in s[1:5]] == [NONE] * 4   # the subtree is dissolved, not kept linked
    # A block put under an orphan is unreachable too; a root stays a root.
    assert chains.link(s[5], s[3]) is True and chains.is_orphan(s[5])
    assert chains.detach(s[0]) == []


def test_none_parent_means_a_hole_in_the_chain():
    index, chains, s = build(2)
    assert chains.link(s[1], None) is True and chains.is_orphan(s[1])
    assert chains.link(s[1], s[1]) is False             # a key is never its own parent
    assert chains.detach(s[0]) == []


def test_removing_one_of_two_children_collapses_the_branch_point():
    index, chains, s = build(4)
    chains.link(s[1], s[0])
    chains.link(s[2], s[0])
    chains.link(s[3], s[0])
    assert chains.children(s[0]) == [s[1], s[2], s[3]]
    assert chains.detach(s[2]) == [] and chains.children(s[0]) == [s[1], s[3]]
    chains.detach(s[1])
    assert int(index.child[s[0]]) == s[3] and chains.branch_points == 0
    chains.link(s[3], s[1])                             # re-parented: leaves its old parent's list
    assert int(index.child[s[0]]) == NONE and chains.children(s[1]) == [s[3]]


def test_confirm_links_a_hit_chain_and_makes_its_first_block_a_root():
    index, chains, s = build(5)
    chain(chains, s[:3])
    chains.detach(s[0])                                 # 1 and 2 are orphans now
    assert chains.is_orphan(s[1]) and chains.is_orphan(s[2])
    chains.confirm(np.array(s[1:5]))                    # a client holding block 0 itself reads 1..4
    assert [int(index.parent[x]) for x in s[1:5]] == [ROOT, s[1], s[2], s[3]]
    assert chains.children(s[3]) == [s[4]]
    chains.confirm(np.array(s[1:5]))                    # known links: one vectorised compare, nothing changes
    assert [int(index.parent[x]) for x in s[1:5]] == [ROOT, s[1], s[2], s[3]]


def test_take_and_give_move_links_to_a_new_slot_without_orphaning_anyone():
    index, chains, s = build(4)
    chain(chains, s[:3])
    links = chains.take(s[1])
    assert chains.detach(s[1]) == []                    # nothing left below the old slot
    chains.give(s[3], links)                            # the object now lives at slot 3
    assert int(index.parent[s[3]]) == s[0] and chains.children(s[0]) == [s[3]]
    assert int(index.parent[s[2]]) == s[3] and chains.children(s[3]) == [s[2]]
    assert chains.detach(s[0]) == [s[3], s[2]]


def test_a_junk_cycle_is_walked_once():
    index, chains, s = build(3)
    chains.link(s[1], s[0])
    chains.link(s[2], s[1])
    chains.confirm(np.array([s[2], s[0]]))              # lookups of [1, 2] and [2, 0]: 0 under 2, a cycle
    assert sorted(chains.detach(s[1])) == [s[0], s[2]]


def test_a_block_put_after_its_parent_was_evicted_for_its_room_is_an_orphan():
    """put_start([P, N]) with P stored and the pool full: N's room is made by evicting P, whose slot N then takes
    over. N cannot be reached (its parent is gone), so it is an orphan and the next victim; the block that was
    not touched (Q) stays."""
    from kvpool.store.config import MasterConfig
    from kvpool.store.master import Master
    from kvpool.store.records import NodeInfo

    from kvpool.planner import UNIT, NullNode

    master = Master(MasterConfig(policy="lru"))
    master.register_node(NodeInfo(node_id="n", dram_bytes=2 * UNIT, alignment=UNIT), NullNode(), expires=False)
    P, Q, N, R = (bytes([c]) * 16 for c in b"PQNR")

    def put(*keys: bytes) -> list[str]:
        out = master.put_start(list(keys), [UNIT] * len(keys))
        grants = [x.grant.grant_id for x in out if x.grant is not None]
        master.put_commit(grants, [0] * len(grants))
        return [x.status.value for x in out]

    put(P)
    put(Q)                                             # LRU victims: P, then Q
    slot_p = master.index.find(P, -1)
    assert put(P, N) == ["exists", "stored"]
    slot_n = master.index.find(N, -1)
    assert master.index.find(P, -1) == -1 and slot_n == slot_p      # P evicted, its slot reused by N
    assert master.placement.chains.is_orphan(slot_n)
    assert master.placement.counters.orphaned == 1
    put(R)                                             # the orphan goes first, not Q
    assert [master.lookup([k], lease=False).hits for k in (Q, N, R)] == [1, 0, 1]
