"""The kvsim compiler: models + bit configs + hardware -> memory map and ISA programs.

Layout: :mod:`.compiled` (the frozen compiled model, ``compile_model`` and the tile
searches), :mod:`.driver` (token tiles x layers for one call or a batched step),
:mod:`.blocks` (attention and MLP blocks, input and head, the registry), :mod:`.builder`
(instructions, weight-tile streaming, barriers), :mod:`.flags` (named flags), :mod:`.sram`
(SRAM plans), :mod:`.ops` (norm, GEMM + residual helpers), :mod:`.lowering` (the lowering
context), :mod:`.dram` and :mod:`.memmap` (the DRAM memory map), :mod:`.kvspec` (KV-cache
specs), :mod:`.kvm` (the compiled-model file), :mod:`.numerics` and :mod:`.calibrate`
(integer parameters).
"""

from .compiled import CORE_MODES, CompiledModel, CompileError, HardwareTarget, compile_model

__all__ = ["CORE_MODES", "CompiledModel", "CompileError", "HardwareTarget", "compile_model"]
