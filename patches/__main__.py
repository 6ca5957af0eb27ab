from verl_consistency.patches.cli import app

app(prog_name="python -m verl_consistency.patches")
