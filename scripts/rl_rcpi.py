"""A watermark agent taught by rollouts (rollout classification policy iteration, one step).

``collect``: at every decision of training windows (served to completion), the sim is copied and
served once per action (the action for one epoch, then the base to the end): the finished-window
goodput of every action (kvrl.envs.rollout). ``fit``: an SB3 DQN's Q-network is fitted by
regression to those rollout gains (in % of the base's goodput) instead of by TD learning, so its
greedy action is the one whose *expected* gain, given what the agent observes, is largest; saved
as a kvrl-train run directory (``best_model.zip`` + ``agent.json``) that kvrl-eval and the
``agent`` plugin load like any DQN agent.

``--base`` is a constant (one of the task's bins) or a saved DQN agent's directory, whose greedy
action on each observation is the base there (one step of policy improvement over that agent).
The collected data hold the base's action at each decision; ``fit`` and ``crossval`` use it.
``fit``'s ``--margin_pct`` (leave the base action only for a predicted gain) is folded into the
network's biases for a constant base, and into the regression targets (every action but the
decision's base action lowered by the margin) for an agent base, whose action a bias cannot follow.

    python scripts/rl_rcpi.py collect --task pool512 --base 0.03 --episodes 4 --seed 0 --out d0.npz
    python scripts/rl_rcpi.py fit --task pool512 --base 0.03 --data d*.npz --seed 0 \
        --out docs/results/agents/pool512-rcpi-seed0
    python scripts/rl_rcpi.py crossval --task pool512 --base 0.03 --data docs/results/rcpi/pool512_*.npz
    python scripts/rl_rcpi.py collect --task slo_shift --base docs/results/agents/slo_shift-cemrule-seed0 \
        --episodes 4 --seed 0 --out r0.npz
    python scripts/rl_rcpi.py collect --task throttle_planner --base 0 --hold 2 --guess_samples 8 \
        --episodes 4 --seed 0 --out g0.npz

``collect --guess_samples K`` scores each action on K guessed futures instead of the one that happened
(kvrl.envs.guess: arrivals drawn at the recent rate, lengths guessed from finished requests): the
targets are then the expectation a server could compute, and ``fit`` distils the planner of
scripts/rl_rule_headroom.py (``--forecast --horizon --blind --samples K --poisson``) into a policy on
the agent's observation (expert iteration). With rules for actions (``env.action.rules``), ``--base`` is
a rule's index.

``crossval``: what the observation predicts, held out by collection file (independent episodes):
for each file, the same network is fitted on the others and its greedy choice on that file's
decisions is scored with the realised rollout gain (in % of the base), for several margins; mean
± 95% CI over the folds, beside the clairvoyant gain (the best action's, per decision), and the margin to fit
with (``recommended_margin``: null when no margin's gain excludes zero; then keep the base, no fit beats it).

Arguments after the options are Hydra overrides of the task's scenario, as in kvrl-train.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import time


def _env(task: str, overrides: list[str], copyable: bool):
    import gymnasium as gym

    import kvrl.envs  # noqa: F401  (registers the ids)
    from kvrl.envs.config import load_task

    extra = ["engine.prefix_hash=xxh3"] if copyable else []    # a keyed BLAKE2b state cannot be deep-copied
    env_id, cfg = load_task(task, [*overrides, *extra])
    return env_id, cfg, gym.make(env_id, config=cfg).unwrapped


def _base_index(env, base: str) -> int:
    """The action index of a constant ``--base``: a bin's value, or with ``env.action.rules`` a rule's
    index."""
    rules = env.actions.rules
    if rules is not None:
        if not base.isdigit() or int(base) >= len(rules):
            raise SystemExit(f"--base {base!r}: the task's actions are rules; give a rule's index in "
                             f"[0, {len(rules) - 1}] ({rules})")
        return int(base)
    bins = [float(b) for b in env.actions.config.bins]
    try:
        value = float(base)
    except ValueError:
        raise SystemExit(f"--base {base!r} is neither a saved agent's directory nor one of the task's bins {bins}")
    if value not in bins:
        raise SystemExit(f"--base {base} is not one of the task's bins {bins}")
    return bins.index(value)


def _base(env, spec: str):
    """``--base``: a bin's action index, or the greedy policy (obs -> action index) of the DQN
    agent saved in the directory ``spec``."""
    constant = _constant(env, spec)
    if constant is not None:
        return constant
    from stable_baselines3 import DQN

    from kvrl.envs.agent_io import INFERENCE_ONLY

    model = DQN.load(os.path.join(spec, "best_model.zip"), device="cpu", custom_objects=INFERENCE_ONLY)
    if model.action_space.n != env.action_space.n:
        raise SystemExit(f"--base {spec}: {model.action_space.n} actions, the task has {env.action_space.n}")
    return lambda obs: int(model.predict(obs, deterministic=True)[0])


def _constant(env, spec: str):
    """The action index of a constant ``--base``; None for an agent's directory (no agent is loaded)."""
    return None if os.path.isdir(spec) else _base_index(env, spec)


def collect(args) -> None:
    import numpy as np

    from kvrl.envs.rollout import collect as collect_rollouts

    from kvrl.envs.rollout import RolloutData

    from kvrl.envs.guess import Guess

    _, _, env = _env(args.task, args.overrides, copyable=True)
    base = _base(env, args.base)
    guess = None if args.guess_samples == 0 else Guess(args.guess_window_s, args.guess_horizon_s,
                                                       not args.guess_replay, args.guess_samples)
    t, wall = time.process_time(), time.monotonic()
    rng = np.random.default_rng(args.seed)
    data, episodes = RolloutData(), 0
    while episodes < args.episodes:         # saved after every decision: a time limit keeps what is done
        if args.max_wall_s is not None and time.monotonic() - wall > args.max_wall_s:
            break
        collect_rollouts(env, base, 1, rng, explore=args.explore, hold=args.hold, record=args.record,
                         skip_s=args.skip_s, until_s=args.until_s, guess=guess, into=data,
                         on_record=lambda d: d.save(args.out))
        episodes += 1
        print(json.dumps({"episodes": episodes, "decisions": len(data.scores),
                          "cpu_s": round(time.process_time() - t, 1)}), flush=True)
    adv = data.advantages_pct()
    print(json.dumps({"out": args.out, "episodes": episodes, "decisions": len(data.scores),
                      "cpu_s": round(time.process_time() - t, 1),
                      "mean_gain_pct": [round(float(x), 3) for x in adv.mean(axis=0)],
                      "best_gain_pct": round(float(adv.max(axis=1).mean()), 3),
                      "base_action_counts": np.bincount(data.base_actions, minlength=env.action_space.n).tolist()}))


def fit(args) -> None:
    import numpy as np
    import torch
    from stable_baselines3 import DQN

    from kvrl.envs.agent_io import write_meta
    from kvrl.envs.rollout import RolloutData

    env_id, cfg, env = _env(args.task, args.overrides, copyable=False)
    base = _constant(env, args.base)
    data = RolloutData.load(args.data, base=base)
    x = np.asarray(data.observations, dtype=np.float32)
    raw = data.advantages_pct()
    clipped = int((np.abs(raw) > args.clip_pct).sum())
    y = np.clip(raw, -args.clip_pct, args.clip_pct).astype(np.float32)
    base_actions = np.asarray(data.base_actions)
    others = np.arange(y.shape[1])[None, :] != base_actions[:, None]
    if base is None:                          # an agent base: the margin lowers the targets of the other actions
        target = (y - args.margin_pct * others).astype(np.float32)
    else:                                     # a constant: folded into the biases below
        target = y
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(x))
    n_val = max(1, int(len(x) * args.val_fraction))
    val, train = order[:n_val], order[n_val:]
    torch.manual_seed(args.seed)
    model = DQN("MlpPolicy", env, seed=args.seed, device="cpu", policy_kwargs={"net_arch": [64, 64]})
    net = model.q_net
    opt = torch.optim.Adam(net.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    xt, yt = torch.as_tensor(x), torch.as_tensor(target)

    def loss_on(idx) -> float:
        with torch.no_grad():
            return float(torch.nn.functional.huber_loss(net(xt[idx]), yt[idx]))

    best = (float("inf"), None)
    for epoch in range(args.epochs):
        perm = rng.permutation(train)
        for i in range(0, len(perm), args.batch):
            b = perm[i:i + args.batch]
            opt.zero_grad()
            loss = torch.nn.functional.huber_loss(net(xt[b]), yt[b])
            loss.backward()
            opt.step()
        v = loss_on(val)
        if v < best[0]:
            best = (v, {k: p.detach().clone() for k, p in net.state_dict().items()})
    net.load_state_dict(best[1])
    if base is not None:
        with torch.no_grad():                 # a margin: leave the base action only for a predicted gain
            last = [m for m in net.q_net if isinstance(m, torch.nn.Linear)][-1]
            last.bias -= args.margin_pct
            last.bias[base] += args.margin_pct
    model.q_net_target.load_state_dict(net.state_dict())
    os.makedirs(args.out, exist_ok=True)
    model.save(os.path.join(args.out, "best_model.zip"))
    write_meta(args.out, "dqn", env_id, cfg)
    with torch.no_grad():
        pred = net(xt[val]).numpy()
    chosen = pred.argmax(axis=1)
    realised = y[val][np.arange(len(val)), chosen]
    summary = {"out": args.out, "decisions": len(x), "targets_clipped": clipped, "val_huber": round(best[0], 4),
               "val_realised_gain_pct": round(float(realised.mean()), 3),
               "val_oracle_gain_pct": round(float(y[val].max(axis=1).mean()), 3),
               "val_action_counts": np.bincount(chosen, minlength=env.action_space.n).tolist(),
               "val_deviation_pct": round(100.0 * float((chosen != base_actions[val]).mean()), 1),
               "margin": "biases" if base is not None else "targets"}
    with open(os.path.join(args.out, "rcpi.json"), "w") as f:
        json.dump({**summary, "args": {k: v for k, v in vars(args).items() if k != "func"}}, f, indent=2)
    print(json.dumps(summary))


def crossval(args) -> None:
    import numpy as np
    import torch

    from kvrl.analysis.stats import mean_ci
    from kvrl.envs.rollout import RolloutData

    torch.manual_seed(args.seed)
    _, _, env = _env(args.task, args.overrides, copyable=False)
    base = _constant(env, args.base)
    parts = [RolloutData.load([path], base=base) for path in args.data]
    x = np.concatenate([np.asarray(d.observations, dtype=np.float32) for d in parts])
    y = np.clip(np.concatenate([d.advantages_pct() for d in parts]), -args.clip_pct, args.clip_pct).astype(np.float32)
    base_actions = np.concatenate([np.asarray(d.base_actions, dtype=np.int64) for d in parts])
    group = np.repeat(np.arange(len(parts)), [len(d.scores) for d in parts])
    others = np.arange(y.shape[1])[None, :] != base_actions[:, None]     # the margin favours the base's action
    gains: dict[float, list[float]] = {m: [] for m in args.margins}
    deviations: dict[float, list[float]] = {m: [] for m in args.margins}

    def predict(train, held, target):
        net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                  torch.nn.ReLU(), torch.nn.Linear(64, y.shape[1]))
        opt = torch.optim.Adam(net.parameters(), lr=args.lr, weight_decay=args.weight_decay)
        xt, yt = torch.as_tensor(x[train]), torch.as_tensor(target[train])
        for _ in range(args.epochs):
            perm = torch.randperm(len(xt))
            for i in range(0, len(xt), args.batch):
                b = perm[i:i + args.batch]
                opt.zero_grad()
                torch.nn.functional.huber_loss(net(xt[b]), yt[b]).backward()
                opt.step()
        with torch.no_grad():
            return net(torch.as_tensor(x[held])).numpy()

    for k in range(len(parts)):
        train, held = group != k, group == k
        pred = None if args.fold_margin else predict(train, held, y)
        for margin in args.margins:
            if args.fold_margin:              # fitted to margin-lowered targets, as fit does for an agent base
                q = predict(train, held, (y - margin * others).astype(np.float32))
            else:                             # the margin applied to the fitted gains
                q = pred - margin * others[held]
            chosen = q.argmax(axis=1)
            gains[margin].append(float(y[held][np.arange(held.sum()), chosen].mean()))
            deviations[margin].append(100.0 * float((chosen != base_actions[held]).mean()))
    fold_means = np.stack([y[group == k].mean(axis=0) for k in range(len(parts))])      # (folds, actions)
    out = {"decisions": len(x), "folds": len(parts), "clairvoyant_gain_pct": round(float(y.max(axis=1).mean()), 3),
           "clairvoyant_gain_pct_per_fold": [round(float(y[group == k].max(axis=1).mean()), 3)
                                             for k in range(len(parts))],
           "action_gain_pct": [[round(v, 3) for v in mean_ci(column.tolist())] for column in fold_means.T]}
    realised = {margin: mean_ci(values) for margin, values in gains.items()}
    for margin, (mean, half) in realised.items():
        out[f"realised_gain_pct_margin_{margin}"] = [round(mean, 3), round(half, 3)]
        out[f"deviation_pct_margin_{margin}"] = round(float(np.mean(deviations[margin])), 1)
    out["recommended_margin"] = recommended_margin(realised)
    print(json.dumps(out))


def recommended_margin(realised: dict[float, tuple[float, float]]) -> float | None:
    """The margin to ``fit`` with, from crossval's held-out realised gain per margin (``{margin: (mean,
    95% CI half-width)}``, % of the base's goodput per decision): of the margins whose interval lies above
    zero, the one with the largest mean; None when no margin's does: keep the base, the fit found nothing
    the observation predicts (docs/rl.md, "A second round of expert iteration")."""
    above = {margin: mean for margin, (mean, half) in realised.items() if mean - half > 0}
    return max(above, key=above.get) if above else None


def main() -> None:
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    logging.disable(logging.WARNING)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(required=True)
    c = sub.add_parser("collect")
    c.add_argument("--episodes", type=int, default=4)
    c.add_argument("--explore", type=float, default=0.3)
    c.add_argument("--record", type=float, default=0.35, help="share of decisions scored")
    c.add_argument("--skip_s", type=float, default=4.0, help="no scoring in a window's first seconds")
    c.add_argument("--until_s", type=float, default=None,
                   help="no scoring after a window's first seconds (with --skip_s 0: teach an episode's start)")
    c.add_argument("--max_wall_s", type=float, default=None, help="no new episode after this many seconds")
    c.add_argument("--hold", type=int, default=1, help="decision epochs each scored action is held before the base")
    c.add_argument("--guess_samples", type=int, default=0,
                   help="K > 0: score each action by its mean goodput over K guessed futures (arrivals drawn at "
                        "the recent rate, output lengths guessed from finished requests; kvrl.envs.guess), what "
                        "a server could expect, instead of on the one future that happened (0: clairvoyant)")
    c.add_argument("--guess_window_s", type=float, default=5.0, help="the recent window the guessed arrivals follow")
    c.add_argument("--guess_horizon_s", type=float, default=20.0, help="seconds ahead the guessed arrivals run")
    c.add_argument("--guess_replay", action="store_true",
                   help="the guessed arrivals replay the recent window instead of drawing a Poisson process")
    c.add_argument("--out", required=True)
    c.set_defaults(func=collect)
    f = sub.add_parser("fit")
    f.add_argument("--data", nargs="+", required=True)
    f.add_argument("--out", required=True)
    f.add_argument("--epochs", type=int, default=300)
    f.add_argument("--batch", type=int, default=64)
    f.add_argument("--lr", type=float, default=1e-3)
    f.add_argument("--weight_decay", type=float, default=1e-4)
    f.add_argument("--val_fraction", type=float, default=0.2)
    f.add_argument("--clip_pct", type=float, default=20.0, help="advantages clipped to +-this % (counted)")
    f.add_argument("--margin_pct", type=float, default=0.0)
    f.set_defaults(func=fit)
    x = sub.add_parser("crossval")
    x.add_argument("--data", nargs="+", required=True, help="one file per fold (a collection seed each)")
    x.add_argument("--margins", type=float, nargs="+", default=[0.0, 0.25, 0.5])
    x.add_argument("--epochs", type=int, default=150)
    x.add_argument("--batch", type=int, default=64)
    x.add_argument("--lr", type=float, default=1e-3)
    x.add_argument("--weight_decay", type=float, default=1e-3)
    x.add_argument("--clip_pct", type=float, default=20.0)
    x.add_argument("--fold_margin", action="store_true",
                   help="fit one network per margin to margin-lowered targets (fit's way with an agent base)")
    x.set_defaults(func=crossval)
    for s in (c, f, x):
        s.add_argument("--task", required=True)
        s.add_argument("--base", required=True,
                       help="the base: a constant (one of the task's bins) or a saved DQN agent's directory")
        s.add_argument("--seed", type=int, default=0)
        s.add_argument("overrides", nargs="*")
    args = p.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
