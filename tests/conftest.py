"""Suite-wide settings."""

from hypothesis import settings

# CI machines are small and shared: wall-clock deadlines would make property tests flaky, and
# no test here is about speed (benchmarks live in bench/).
settings.register_profile("dlmkit", deadline=None)
settings.load_profile("dlmkit")
