"""The wire contract: ``.proto`` sources under ``cantata/v1`` and the Python
modules generated from them under ``v1`` (see ``codegen``)."""
