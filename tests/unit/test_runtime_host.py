"""The machine record of a wall-clock figure, from /proc/cpuinfo text given by hand."""

from __future__ import annotations

from stream_dapo.runtime.host import cpu_isa, cpu_model, describe_machine

ZEN3 = (
    "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n"
    "model name\t: AMD EPYC 7B13\nflags\t\t: fpu sse4_2 avx avx2 fma\n\n"
    "processor\t: 1\nmodel name\t: Other\nflags\t: avx512f\n"
)
ZEN4 = "cpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC 9B14\nflags\t\t: avx2 avx512f avx512_vnni avx512_bf16 fma\n"


def test_the_vector_isa_of_the_first_processor_only() -> None:
    assert cpu_isa(ZEN3) == "family 25 model 1: avx2"  # the second processor's avx512f is not read
    assert cpu_isa(ZEN4) == "family 25 model 17: avx2 avx512f avx512_bf16 avx512_vnni"
    assert (
        cpu_isa("flags\t: sse2\n")
        == "family ? model ?: none of avx2 avx512f avx512_bf16 avx512_vnni amx_bf16"
    )


def test_one_line_tells_apart_two_machines_of_one_model_name() -> None:
    assert cpu_model(ZEN3) == "AMD EPYC 7B13"
    assert describe_machine(ZEN3, cores=2) == "AMD EPYC 7B13 (family 25 model 1: avx2), 2 usable cores"
    same_name = ZEN4.replace("9B14", "7B13")
    assert describe_machine(same_name, cores=2) != describe_machine(ZEN3, cores=2)
