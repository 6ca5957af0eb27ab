# Sourced by docker/Dockerfile's RUN lines that call pip: use the optional build secrets.
#   cabundle: a PEM bundle for a TLS-intercepting proxy or a private mirror (becomes PIP_CERT);
#             give the full bundle (system CAs + yours): pip uses it instead of its own.
#   pipconf:  a pip.conf, e.g. an index URL with credentials (becomes PIP_CONFIG_FILE).
# Secrets are mounted under /run/secrets only for the RUN that asks for them: never in a layer,
# never in the image's history (unlike build args, which `docker history` shows).
if [ -s /run/secrets/cabundle ]; then export PIP_CERT=/run/secrets/cabundle; fi
if [ -s /run/secrets/pipconf ]; then export PIP_CONFIG_FILE=/run/secrets/pipconf; fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
