

raise RuntimeError("attack outcomes " + _json.dumps(attack()))
