from verl_consistency.patches.tooling.cli import app

app(prog_name="python -m verl_consistency.patches")
