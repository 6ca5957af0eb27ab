"""The msprobe configs of every run, and the defaults the image bakes in."""
