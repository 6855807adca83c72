"""Stream a chat completion, then a response (the Responses API), from a running `python -m minillm.serve`
with the official openai client.

    make serve            # in another terminal
    python examples/openai_stream.py
"""

from openai import OpenAI

client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")
model = client.models.list().data[0].id
stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Write a haiku about paged attention."}],
    max_tokens=64,
    stream=True,
    stream_options={"include_usage": True},
)
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        print(chunk.choices[0].delta.content, end="", flush=True)
    if chunk.usage:
        print(f"\n[{chunk.usage.completion_tokens} tokens]")

# The same through the Responses API: typed events, the text in response.output_text.delta
for event in client.responses.create(model=model, input="Now one about CUDA graphs.", max_output_tokens=64,
                                     stream=True):
    if event.type == "response.output_text.delta":
        print(event.delta, end="", flush=True)
    elif event.type in ("response.completed", "response.incomplete"):
        print(f"\n[{event.response.usage.output_tokens} tokens, {event.response.status}]")
