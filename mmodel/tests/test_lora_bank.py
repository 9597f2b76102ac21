"""Adapters applied per row (mmodel.runners.lora_bank) give each row what PEFT gives that adapter
alone, whatever the others in the batch take; what it cannot apply per row is refused."""

import pytest

from mmodel.runners.lora_bank import AdapterRefused, LoraBank
from mmodel.tests.tiny import tiny_model

torch = pytest.importorskip("torch")


def adapter(base, folder, seed: int, **config):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    settings = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"],
                "init_lora_weights": False, **config}
    get_peft_model(model, LoraConfig(**settings)).save_pretrained(str(folder))
    return str(folder)


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    root = tmp_path_factory.mktemp("bank")
    base = tiny_model(root / "base")
    return str(base), {
        "plain": adapter(base, root / "plain", 1),
        # Another rank, more layers, rsLoRA, and an alpha of its own on the MLP's down layer.
        "wide": adapter(base, root / "wide", 2, r=8, use_rslora=True,
                        target_modules=["q_proj", "k_proj", "o_proj", "down_proj"]),
        "patterned": adapter(base, root / "patterned", 3, target_modules=["v_proj", "up_proj"],
                             rank_pattern={"up_proj": 2}, alpha_pattern={"up_proj": 16}),
    }


def logits_alone(base: str, folder: str | None, ids) -> "torch.Tensor":
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if folder:
        model = PeftModel.from_pretrained(model, folder)
    with torch.inference_mode():
        return model.eval()(input_ids=ids).logits


def test_each_row_of_a_mixed_batch_gets_what_its_adapter_alone_gives(family):
    from transformers import AutoModelForCausalLM

    base, folders = family
    torch.manual_seed(0)
    ids = torch.randint(3, 60, (5, 7))
    plan = ["plain", None, "wide", "patterned", "plain"]
    expected = [logits_alone(base, folders.get(name) if name else None, ids[i:i + 1])[0]
                for i, name in enumerate(plan)]
    # The adapters really change the answer: otherwise this test could not fail.
    assert not torch.allclose(expected[0], expected[1], atol=1e-3)

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    bank = LoraBank(model)
    for name, folder in folders.items():
        bank.load(name, folder)
    bank.use(plan)
    with torch.inference_mode():
        mixed = model(input_ids=ids).logits
        bank.use(["wide"] * 5)  # one adapter for every row
        same = model(input_ids=ids).logits
        bank.use([None] * 5)  # the base alone
        plain = model(input_ids=ids).logits
    for index in range(len(plan)):
        assert torch.allclose(mixed[index], expected[index], atol=1e-5), plan[index]
    assert torch.allclose(same[2], expected[2], atol=1e-5)
    assert torch.allclose(plain[1], expected[1], atol=1e-5)

    bank.unload("wide")  # its rows now get the base
    bank.use(["wide", "plain"])
    with torch.inference_mode():
        after = model(input_ids=ids[:2]).logits
    assert torch.allclose(after[0], logits_alone(base, None, ids[:1])[0], atol=1e-5)
    assert torch.allclose(after[1], logits_alone(base, folders["plain"], ids[1:2])[0],
                          atol=1e-5)


def test_what_cannot_be_applied_per_row_is_refused_with_the_reason(family, tmp_path):
    from transformers import AutoModelForCausalLM

    base, _ = family
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    bank = LoraBank(model)
    dora = adapter(base, tmp_path / "dora", 4, use_dora=True)
    with pytest.raises(AdapterRefused, match="DoRA"):
        bank.load("dora", dora)
    embedding = adapter(base, tmp_path / "embedding", 5, target_modules=["embed_tokens"])
    with pytest.raises(AdapterRefused, match="Linear layers only"):
        bank.load("embedding", embedding)
    other = tiny_model(tmp_path / "other", hidden=48, layers=3)
    deeper = adapter(other, tmp_path / "deeper", 6)
    with pytest.raises(AdapterRefused, match="another model"):
        bank.load("deeper", deeper)
    assert bank.loaded == {}
