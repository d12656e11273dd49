"""NCCL's tree across boxes: a chain inside each box, a double binary tree between boxes.

``btree`` and ``dtree`` port ``ncclGetBtree`` / ``ncclGetDtree`` (src/graph/trees.cc): the first
tree is a binary tree over the node ranks, the second its mirror (an even count of nodes) or
its shift by one (odd), so a node that is a leaf in one tree is inside the other. connect.cc
(connectTrees) gives channel c the first tree and channel c + nChannels (the duplicated half)
the second: each tree carries half the bytes.

Inside a box a tree is a chain from the head GPU, the one the network reaches (search.cc tree
pattern "NET n -> GPU a -> GPU b -> .. -> GPU x"), down to its last GPU. An all-reduce reduces up
(every chain hop and every child-to-parent box edge carries the tree's bytes once) and
broadcasts down (each of them once the other way): ``transfers`` lists them as
(src, dst, between boxes, bytes per byte of the buffer).
"""

from __future__ import annotations


def btree(nranks: int, rank: int) -> tuple[int, int, int]:
    """ncclGetBtree: (parent, child0, child1) of ``rank`` in the binary tree, -1 for none."""
    bit = 1
    while bit < nranks:
        if bit & rank:
            break
        bit <<= 1
    if rank == 0:
        return -1, -1, (bit >> 1) if nranks > 1 else -1
    up = (rank ^ bit) | (bit << 1)
    if up >= nranks:
        up = rank ^ bit
    lowbit = bit >> 1
    down0 = -1 if lowbit == 0 else rank - lowbit
    down1 = -1 if lowbit == 0 else rank + lowbit
    while down1 >= nranks:
        down1 = -1 if lowbit == 0 else rank + lowbit
        lowbit >>= 1
    return up, down0, down1


def dtree(nranks: int, rank: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """ncclGetDtree: ``rank``'s (parent, child0, child1) in the first and the second tree."""
    first = btree(nranks, rank)
    if nranks % 2 == 1:  # shift
        u, d0, d1 = btree(nranks, (rank - 1 + nranks) % nranks)
        second = tuple(-1 if x == -1 else (x + 1) % nranks for x in (u, d0, d1))
    else:  # mirror
        u, d0, d1 = btree(nranks, nranks - 1 - rank)
        second = tuple(-1 if x == -1 else nranks - 1 - x for x in (u, d0, d1))
    return first, (second[0], second[1], second[2])


def parents(nnodes: int) -> tuple[list[int], list[int]]:
    """Each node's parent (-1: the root) in the two trees."""
    pairs = [dtree(nnodes, r) for r in range(nnodes)]
    return [p[0][0] for p in pairs], [p[1][0] for p in pairs]


def transfers(chains: list[tuple[int, ...]]) -> list[tuple[int, int, bool, float]]:
    """Every transfer of one tree all-reduce over boxes whose chains (head first) are
    ``chains``, node k being ``chains[k]``: (src, dst, between boxes, bytes per buffer byte)."""
    out: list[tuple[int, int, bool, float]] = []
    for tree_parents in parents(len(chains)):
        for k, chain in enumerate(chains):
            for a, b in zip(chain, chain[1:], strict=False):  # reduce up, broadcast down
                out += [(b, a, False, 0.5), (a, b, False, 0.5)]
            parent = tree_parents[k]
            if parent >= 0:
                head, up = chain[0], chains[parent][0]
                out += [(head, up, True, 0.5), (up, head, True, 0.5)]
    return out
