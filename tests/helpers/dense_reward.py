"""A dense reward for loop tests (data.reward=helpers.dense_reward:letter_share): the share of letters in the
response, so a random tiny model's samples in a group almost surely differ, whatever the sampler's
random stream (a binary reward leaves whole steps without variance, hence without a gradient, by chance)."""

from rlvr.rewards.types import Reward, Status


def letter_share(response: str, example) -> Reward:
    share = sum(c.isalpha() for c in response) / len(response) if response else 0.0
    return Reward(share, {"letters": share}, Status.CORRECT if share >= 0.5 else Status.INCORRECT)
