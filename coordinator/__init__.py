"""The coordinator: builds round specs from round.toml and starts and follows rounds at the
aggregator."""
