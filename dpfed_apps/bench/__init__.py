"""Benchmarks that ship with the package, so ``dpfed bench`` works from an installed wheel.

``round``: latency of one federated round over real gRPC with N simulated sites
(``simulated_sites``). The other benchmarks stay scripts in the source tree's benchmarks/.
"""
