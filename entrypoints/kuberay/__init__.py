"""Where the command line talks to KubeRay."""
