"""``verl-consistency run``: the plan, the override table and its refusals, the prompt set and reward."""
