"""`python -m rlvr ...` and `torchrun --nproc_per_node N -m rlvr train ...`: the rlvr command."""

from rlvr.cli import main

main()
