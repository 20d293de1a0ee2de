"""The decode program in one package: what the splits compute, a NumPy reference and CUDA kernels.

``decode.DecodeProgram`` is the scheduler's ``Program``; ``plan`` is the plain
data of one split; ``numpy_exec`` and ``cuda_exec`` (with ``kernels.cu``) are
its two executors; ``codecs`` and ``weights`` hold the GGUF block formats.
``import sim.program`` never imports CuPy.
"""

from sim.program.codecs import PROGRAM_CACHE_TYPES, decode_rows, encode_rows
from sim.program.decode import DecodeProgram, WeightStore, gpu_program
from sim.program.shape import ProgramConfig, full_size

__all__ = ["PROGRAM_CACHE_TYPES", "DecodeProgram", "ProgramConfig", "WeightStore", "decode_rows", "encode_rows", "full_size", "gpu_program"]
