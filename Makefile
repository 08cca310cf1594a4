# The two commands of the README. Each runs the idempotent setup first, so either
# works alone on a fresh machine.
.PHONY: setup demo test

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/canal-ha demo

test: setup
	bash scripts/test.sh
