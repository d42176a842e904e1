import os

# keep BLAS/OpenMP from oversubscribing the 2 cores when ranks run beside pytest
os.environ.setdefault("OMP_NUM_THREADS", "1")
