"""Chat templates (Jinja, as `tokenizer.chat_template`) in the Qwen3 / Hermes tool-calling format.

Both render ChatML turns (`<|im_start|>role\\n…<|im_end|>\\n`), tool calls as
`<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>` inside the assistant turn, and tool
results as `<tool_response>\\n…\\n</tool_response>` blocks inside a user turn (consecutive tool
messages share one turn), exactly as Qwen3 does.

- `QWEN3_TEMPLATE` follows Qwen3's own template, including its reasoning handling: an assistant
  turn before the last real user query has its `<think>…</think>` part stripped, and the final
  assistant turn after it gets a `<think>\\n…\\n</think>\\n\\n` block (empty when there is no
  reasoning). That makes the template *not prefix-preserving*: templating a conversation after a
  new user turn changes the text of earlier assistant turns. See `tracerl.models.chat`.
- `CHATML_TEMPLATE` is Qwen2.5's: Qwen3's turns and tool list (each tool's JSON schema) without the
  reasoning handling, tool-call arguments as canonical JSON. It is prefix-preserving. It is the one to
  give a ChatML model whose own template cannot render tools (`tracerl import-model --chat-template chatml`).
- `TINY_AGENT_TEMPLATE` is the embedded tiny agent's: the same turns and tool-call syntax, no
  reasoning block, and tools listed compactly (one line per tool: name, then the parameter names,
  required ones first) so the system prompt of a small model stays short. It is prefix-preserving.
"""

_TOOL_CALLS = r"""
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}"""

# The tiny agent's: parsed arguments (an OpenAI client's earlier calls) render as canonical JSON, the
# text tracerl keeps (`canonical_json`); Qwen3's own template keeps `tojson`'s spacing.
_TOOL_CALLS_CANONICAL = _TOOL_CALLS.replace("| tojson }}", '| tojson(separators=(",", ":"), sort_keys=True) }}')

_TOOL_TURNS = r"""
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}"""

_CONTENT = r"""
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}"""

_SYSTEM_AND_TOOLS = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}"""

QWEN3_TEMPLATE = (
    _SYSTEM_AND_TOOLS
    + r"""
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}"""
    + _CONTENT
    + r"""
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}"""
    + _TOOL_CALLS
    + _TOOL_TURNS
    + r"""
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""
)

TINY_AGENT_TEMPLATE = (
    r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n<tools>" }}
    {%- for tool in tools %}
        {%- set fn = tool.function if tool.function is defined else tool %}
        {%- set params = fn.parameters.properties if (fn.parameters is defined and fn.parameters.properties is defined) else {} %}
        {%- set required = fn.parameters.required if (fn.parameters is defined and fn.parameters.required is defined) else [] %}
        {{- "\n" + fn.name + "(" }}
        {%- set names = namespace(items=[]) %}
        {%- for p in required %}{%- set names.items = names.items + [p] %}{%- endfor %}
        {%- for p in params %}{%- if p not in required %}{%- set names.items = names.items + [p + "?"] %}{%- endif %}{%- endfor %}
        {{- names.items | join(", ") + ")" }}
    {%- endfor %}
    {{- "\n</tools>\nCall a tool as <tool_call>\n{\"name\": <name>, \"arguments\": <json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}"""
    + _CONTENT
    + r"""
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\n' + content }}"""
    + _TOOL_CALLS_CANONICAL
    + _TOOL_TURNS
    + r"""
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}"""
)


CHATML_TEMPLATE = (
    _SYSTEM_AND_TOOLS
    + r"""
{%- for message in messages %}"""
    + _CONTENT
    + r"""
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\n' + content }}"""
    + _TOOL_CALLS_CANONICAL
    + _TOOL_TURNS
    + r"""
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}"""
)

# The templates `tracerl import-model --chat-template NAME` names.
CHAT_TEMPLATES = {"chatml": CHATML_TEMPLATE, "qwen3": QWEN3_TEMPLATE, "tiny-agent": TINY_AGENT_TEMPLATE}

# Tokens every Qwen3-style tokenizer must hold as single tokens.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKUP_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
END_OF_TURN = "<|im_end|>"
