"""`sov serve` checked with the official `openai` Python client (version pinned in
requirements.txt), plus `/metrics` read by the official Prometheus client's text parser and a
structured-output answer validated by `jsonschema`.

Needs a running server: SOV_BASE_URL (e.g. http://127.0.0.1:8000) and, when it has one,
SOV_API_KEY. `run.sh` next to this file starts one on loopback with the default model and runs
these tests; `.ci/run` calls it.
"""

import json
import os
import unittest
import urllib.request

import jsonschema
import openai
from prometheus_client.parser import text_string_to_metric_families

BASE = os.environ.get("SOV_BASE_URL", "http://127.0.0.1:8000").rstrip("/")
KEY = os.environ.get("SOV_API_KEY") or "none"


def client():
    return openai.OpenAI(base_url=f"{BASE}/v1", api_key=KEY, max_retries=0, timeout=120)


class OpenAIClient(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.client = client()
        models = cls.client.models.list().data
        assert len(models) == 1, models
        cls.model = models[0].id

    def test_models_list(self):
        page = self.client.models.list()
        self.assertEqual(page.data[0].object, "model")
        self.assertEqual(self.client.models.retrieve(self.model).id, self.model)
        with self.assertRaises(openai.NotFoundError):
            self.client.models.retrieve("no-such-model")
        self.assertGreater(page.data[0].model_extra.get("max_model_len", 0), 0)

    def test_chat_completion(self):
        r = self.client.chat.completions.create(
            model=self.model,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=12,
            temperature=0,
        )
        self.assertEqual(r.object, "chat.completion")
        self.assertEqual(len(r.choices), 1)
        choice = r.choices[0]
        self.assertEqual(choice.message.role, "assistant")
        self.assertTrue(choice.message.content)
        self.assertIn(choice.finish_reason, ("stop", "length"))
        self.assertLessEqual(r.usage.completion_tokens, 12)
        self.assertGreater(r.usage.prompt_tokens, 0)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)

    def test_chat_stream_equals_plain(self):
        messages = [{"role": "user", "content": "Name three colors."}]
        plain = self.client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=16, temperature=0
        )
        stream = self.client.chat.completions.create(
            model=self.model,
            messages=messages,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, finish, usage = "", None, None
        for chunk in stream:
            self.assertEqual(chunk.object, "chat.completion.chunk")
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
        self.assertEqual(text, plain.choices[0].message.content)
        self.assertEqual(finish, plain.choices[0].finish_reason)
        self.assertIsNotNone(usage, "include_usage sends a usage chunk")
        self.assertEqual(usage.completion_tokens, plain.usage.completion_tokens)

    def test_completion(self):
        r = self.client.completions.create(
            model=self.model,
            prompt="The capital of France is",
            max_tokens=6,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        self.assertEqual(r.object, "text_completion")
        self.assertTrue(r.choices[0].text)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 6)

    def test_completion_stream(self):
        args = dict(model=self.model, prompt="One, two, three,", max_tokens=8, temperature=0)
        plain = self.client.completions.create(**args)
        streamed = "".join(
            c.choices[0].text for c in self.client.completions.create(stream=True, **args) if c.choices
        )
        self.assertEqual(streamed, plain.choices[0].text)

    def test_unknown_model_is_not_found(self):
        with self.assertRaises(openai.NotFoundError) as cx:
            self.client.chat.completions.create(
                model="no-such-model", messages=[{"role": "user", "content": "hi"}], max_tokens=1
            )
        self.assertEqual(cx.exception.status_code, 404)
        self.assertEqual(cx.exception.code, "model_not_found")

    def test_bad_value_is_bad_request(self):
        with self.assertRaises(openai.BadRequestError) as cx:
            self.client.completions.create(
                model=self.model, prompt="hi", max_tokens=4, temperature=7.0
            )
        self.assertEqual(cx.exception.param, "temperature")

    def test_json_schema_response(self):
        schema = {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "population": {"type": "integer"},
            },
            "required": ["city", "population"],
            "additionalProperties": False,
        }
        try:
            r = self.client.chat.completions.create(
                model=self.model,
                messages=[{"role": "user", "content": "Give the largest city of France as JSON."}],
                max_tokens=64,
                temperature=0,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "city", "schema": schema, "strict": True},
                },
            )
        except openai.BadRequestError as e:
            if "not supported" in str(e):
                print(f"SKIP json_schema: the server does not do structured output yet ({e.message})")
                self.skipTest("structured output not supported by this server yet")
            raise
        self.assertEqual(r.choices[0].finish_reason, "stop", "the grammar ends the object")
        value = json.loads(r.choices[0].message.content)
        jsonschema.validate(value, schema)


class Metrics(unittest.TestCase):
    def test_metrics_parse_with_prometheus_client(self):
        # One request first, so every histogram has a sample.
        client().completions.create(
            model=client().models.list().data[0].id, prompt="Hi", max_tokens=3, temperature=0
        )
        req = urllib.request.Request(f"{BASE}/metrics", headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(req, timeout=30) as res:
            self.assertTrue(res.headers.get("Content-Type", "").startswith("text/plain"))
            text = res.read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        # The parser names counter families without their `_total` suffix.
        expected = {
            "sov_num_requests_running": "gauge",
            "sov_num_requests_waiting": "gauge",
            "sov_kv_blocks_used": "gauge",
            "sov_kv_blocks_total": "gauge",
            "sov_receipt_height": "gauge",
            "sov_prompt_tokens": "counter",
            "sov_generation_tokens": "counter",
            "sov_request_success": "counter",
            "sov_num_preemptions": "counter",
            "sov_checkpoints": "counter",
            "sov_spec_decode_accepted_tokens": "counter",
            "sov_kv_blocks_swapped_out": "counter",
            "sov_kv_blocks_swapped_in": "counter",
            "sov_num_recomputed_sequences": "counter",
            "sov_prefix_cache_queries": "counter",
            "sov_prefix_cache_hits": "counter",
            "sov_time_to_first_token_seconds": "histogram",
            "sov_inter_token_latency_seconds": "histogram",
            "sov_e2e_request_latency_seconds": "histogram",
        }
        for name, kind in expected.items():
            self.assertIn(name, families, f"{name} missing")
            self.assertEqual(families[name].type, kind, name)
        gen = [s for s in families["sov_generation_tokens"].samples if s.name.endswith("_total")]
        self.assertGreaterEqual(gen[0].value, 3)
        e2e = families["sov_e2e_request_latency_seconds"].samples
        count = next(s.value for s in e2e if s.name.endswith("_count"))
        inf = next(s.value for s in e2e if s.name.endswith("_bucket") and s.labels["le"] == "+Inf")
        self.assertGreaterEqual(count, 1)
        self.assertEqual(inf, count)


if __name__ == "__main__":
    unittest.main(verbosity=2)
