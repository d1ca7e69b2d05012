"""Built-in rule packs: ``[settings] packs = ["NAME"]`` merges ``checks/packs/NAME.toml``."""
