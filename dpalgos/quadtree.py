"""Quadtrees (2^d-ary trees) over a d-dimensional grid of cells^d cells, cells a power of two, after Cormode,
Procopiuc, Srivastava, Shen & Yu, "Differentially private spatial decompositions" (ICDE 2012): the root is the
whole grid, every node splits into its 2^d equal sub-blocks, the leaves are the cells.

Laid out in Morton (Z-) order, where a cell's position interleaves the bits of its coordinates, every node of the
quadtree is a contiguous run of leaves and its children are its 2^d equal sub-runs: the quadtree IS the complete
2^d-ary tree over the cells in Morton order (`dpalgos.hierarchy.Tree`), so Hay et al.'s least-squares consistency
(Htree) and Lee, Wang & Kifer's ADMM over it apply as they are. A record falls in one node per level: L1
sensitivity = levels = log2(cells) + 1 (`hierarchy.tree_plan`'s argument).

`pyramid` gives the same blocks in the order a reader wants them (level by level, row-major within a level) with
their cell ranges: what the `grid` release publishes as its levels.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from dpalgos.hierarchy import Tree


def is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def quadtree(cells: int, d: int) -> Tree:
    """The 2^d-ary tree over the cells^d cells in Morton order."""
    if not is_power_of_two(cells):
        raise ValueError(f"a quadtree needs a power of two of cells per axis, got {cells}")
    return Tree(cells ** d, 2 ** d)


@lru_cache(maxsize=4)
def morton(cells: int, d: int) -> np.ndarray:
    """perm with perm[z] = the row-major index of the cell at Morton position z: grid.ravel()[perm] is the grid
    in Morton order, and out[perm] = leaves puts Morton-ordered leaves back in row-major order. Axis 0's bit is
    the most significant of each interleaved group."""
    bits = int(cells).bit_length() - 1
    coords = np.indices((cells,) * d).reshape(d, -1)
    z = np.zeros(cells ** d, dtype=np.int64)
    for b in range(bits):
        for axis in range(d):
            z |= ((coords[axis] >> b) & 1).astype(np.int64) << (b * d + (d - 1 - axis))
    perm = np.empty_like(z)
    perm[z] = np.arange(z.size)
    perm.flags.writeable = False
    return perm


def levels(cells: int) -> int:
    """Levels of the pyramid over cells per axis: the root, ..., the cells."""
    return int(cells).bit_length()


def pyramid(grid: np.ndarray) -> np.ndarray:
    """Every block's sum, level 0 (the whole grid) to the cells, row-major within a level, concatenated."""
    grid = np.asarray(grid, dtype=np.float64)
    d, cells = grid.ndim, grid.shape[0]
    out = []
    for level in range(levels(cells)):
        side, block = 2 ** level, cells >> level
        split = grid.reshape(sum(((side, block) for _ in range(d)), ()))
        out.append(split.sum(axis=tuple(range(1, 2 * d, 2))).ravel())
    return np.concatenate(out)


def pyramid_size(cells: int, d: int) -> int:
    return sum((2 ** level) ** d for level in range(levels(cells)))


def pyramid_columns(cells: int, d: int) -> dict[str, np.ndarray]:
    """Each block's level and, per axis k, its cells [first_k, end_k)."""
    out = {"level": [], **{f"first_{k}": [] for k in range(d)}, **{f"end_{k}": [] for k in range(d)}}
    for level in range(levels(cells)):
        side, block = 2 ** level, cells >> level
        coords = np.indices((side,) * d).reshape(d, -1)
        out["level"].append(np.full(coords.shape[1], level, dtype=np.int32))
        for k in range(d):
            out[f"first_{k}"].append((coords[k] * block).astype(np.int32))
            out[f"end_{k}"].append(((coords[k] + 1) * block).astype(np.int32))
    return {name: np.concatenate(parts) for name, parts in out.items()}
