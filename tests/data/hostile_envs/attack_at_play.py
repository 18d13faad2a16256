

class AttackingEnv(LookThenActEnv):
    """The known-good environment, attacking on every reset (and telling its gold calls, for scripted policies)."""

    def _setup(self, seed, options):
        toolbox, opening, info = super()._setup(seed, options)
        info = {**info, "attacks": attack(), "gold_actions": [a.model_dump() for a in self.oracle(seed)]}
        return toolbox, opening, info


def make_env(difficulty=1):
    return AttackingEnv(difficulty)
