"""store/chains.py over a real Index: links from puts and lookups, a leaving block dissolves its subtree into
orphans (exact order), branch points, relocation keeps links, junk cycles terminate; a put never orphans its own new
blocks by evicting its prefix for their room."""

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


def test_a_put_never_evicts_its_own_prefix_to_make_room_for_its_new_blocks():
    """put_start([P, N]) with P stored and the pool full: N's room is made by evicting Q, although P is the colder
    (P is this put's own prefix: taken out, N would be stored only to be unreachable, an orphan). When only the
    put's own blocks could make the room, its new block is NO_SPACE and the chain stays whole."""
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

    def hits(*keys: bytes) -> int:
        return master.lookup(list(keys), lease=False).hits

    put(P)
    put(Q)                                             # LRU victims: P, then Q
    assert put(P, N) == ["exists", "stored"]
    assert [hits(k) for k in (P, Q, N)] == [1, 0, 1] and hits(P, N) == 2
    slot_n = master.index.find(N, -1)
    assert not master.placement.chains.is_orphan(slot_n) and master.placement.counters.orphaned == 0
    assert int(master.index.leases[master.index.find(P)]) == 0     # held only while the put made its room
    assert put(P, N, R) == ["exists", "exists", "no_space"]        # only P and N could make R's room
    assert hits(P, N, R) == 2 and master.stats()["evictions"] == {"dram": 1, "ssd": 0}
    master.index.check_invariants()
