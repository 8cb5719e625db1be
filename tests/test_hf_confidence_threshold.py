"""`confidence-stop`'s threshold re-fit is transformers' own: fed the same rounds, `ConfidenceStop` and
`AssistedCandidateGenerator.update_candidate_strategy` (run as transformers ships it) pick the same thresholds."""
import random
from types import SimpleNamespace

import pytest
from transformers import GenerationConfig
from transformers.generation.candidate_generator import AssistedCandidateGenerator

from specdec_utils.core import policies

pytest.importorskip("sklearn")  # transformers re-fits only when scikit-learn is installed


def hf_generator(threshold: float) -> AssistedCandidateGenerator:
    """The generator's re-fit state without a model: the attributes `update_candidate_strategy` reads."""
    generator = object.__new__(AssistedCandidateGenerator)
    generator.assistant_generation_config = GenerationConfig(num_assistant_tokens_schedule="constant",
                                                             assistant_confidence_threshold=threshold)
    generator.generation_config = GenerationConfig(assistant_confidence_threshold=threshold)
    generator.probs, generator.matches = [], []
    return generator


@pytest.mark.parametrize("seed", range(5))
def test_confidence_stop_refits_as_transformers_does(seed):
    rng = random.Random(seed)
    ours, hf = policies.ConfidenceStop(gamma=8, threshold=0.4), hf_generator(0.4)
    refits = 0
    for _ in range(60):
        ours.round_gamma()
        drafted = [rng.random() for _ in range(rng.randint(1, 8))]
        if rng.random() < 0.3:  # coarse probabilities make equal ROC costs, where rounding decides
            drafted = [round(p * 4) / 4 for p in drafted]
        for p in drafted:
            ours.stop_after(SimpleNamespace(token_prob=p))
        accepted = next((i for i, p in enumerate(drafted) if rng.random() > p), len(drafted))
        ours.observe(SimpleNamespace(drafted=len(drafted), accepted=accepted))
        hf.probs.extend(drafted)  # what `_generate_candidates` records: every drafted token's probability
        hf.update_candidate_strategy(None, None, accepted)
        assert ours.probs == hf.probs and ours.matches == hf.matches
        assert ours.threshold == hf.assistant_generation_config.assistant_confidence_threshold
        refits += ours.threshold != 0.4
    assert refits > 0

