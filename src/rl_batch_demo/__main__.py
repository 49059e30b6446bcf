"""`python -m rl_batch_demo`: the command line."""

from .cli import cli

if __name__ == "__main__":
    cli()
