"""The QUBO core: the block-removal QUBO and its constraints, ranked states, synthetic instances (no torch)."""

from cbo.qubo.block_qubo import BlockQUBO, Constraints
from cbo.qubo.states import RankedStates, State

__all__ = ["BlockQUBO", "Constraints", "RankedStates", "State"]
