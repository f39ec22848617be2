"""Tools around the kernels: checking them against the reference (:mod:`.verify`), the machine's
FMA roofline (:mod:`.peak`), reading their assembly (:mod:`.asm`),
and the benchmark against PyTorch (:mod:`.bench`)."""
