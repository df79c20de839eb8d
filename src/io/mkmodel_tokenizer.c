/* mkmodel_tokenizer.c - the tokenizer files mkmodel writes for tiny models.
 *
 * tokenizer.json: a byte-level BPE in the layout of DeepSeek-V3's own file: ids 0/1/2 are
 * <｜begin▁of▁sentence｜> / <｜end▁of▁sentence｜> / <｜▁pad▁｜>, ids 3..258 the 256 byte tokens
 * (GPT-2 byte-to-unicode alphabet, ordered by code point as in DeepSeek's vocab), then tokens
 * learned by BPE training on a built-in text (k_corpus, written for this purpose) until the
 * vocabulary is full or no pair occurs twice, then DeepSeek's added tokens (fim, <｜User｜>,
 * <｜Assistant｜>, <|EOT|>, the tool-call tokens) and <think> / </think>. Normalizer, pre-tokenizer
 * (the three Split regexes + ByteLevel), post-processor and decoder are DeepSeek-V3's.
 * tokenizer_config.json: DeepSeek-V3's file verbatim (LlamaTokenizerFast, add_bos_token, the
 * chat template). Deterministic: training ties break on the smaller (left, right) id pair. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "core/hash.h"
#include "core/mmap_file.h"
#include "core/status.h"
#include "io/mkmodel.h"

/* DeepSeek-V3's tokenizer_config.json (/work/shared/data/tokenizers/deepseek-v3), verbatim. */
static const char k_tokenizer_config[] =
    "{\n"
    "  \"add_bos_token\": true,\n"
    "  \"add_eos_token\": false,\n"
    "  \"bos_token\": {\n"
    "    \"__type\": \"AddedToken\",\n"
    "    \"content\": \"<｜begin▁of▁sentence｜>\",\n"
    "    \"lstrip\": false,\n"
    "    \"normalized\": true,\n"
    "    \"rstrip\": false,\n"
    "    \"single_word\": false\n"
    "  },\n"
    "  \"clean_up_tokenization_spaces\": false,\n"
    "  \"eos_token\": {\n"
    "    \"__type\": \"AddedToken\",\n"
    "    \"content\": \"<｜end▁of▁sentence｜>\",\n"
    "    \"lstrip\": false,\n"
    "    \"normalized\": true,\n"
    "    \"rstrip\": false,\n"
    "    \"single_word\": false\n"
    "  },\n"
    "  \"legacy\": true,\n"
    "  \"model_max_length\": 131072,\n"
    "  \"pad_token\": {\n"
    "    \"__type\": \"AddedToken\",\n"
    "    \"content\": \"<｜end▁of▁sentence｜>\",\n"
    "    \"lstrip\": false,\n"
    "    \"normalized\": true,\n"
    "    \"rstrip\": false,\n"
    "    \"single_word\": false\n"
    "  },\n"
    "  \"sp_model_kwargs\": {},\n"
    "  \"unk_token\": null,\n"
    "  \"tokenizer_class\": \"LlamaTokenizerFast\",\n"
    "  \"chat_template\": \"{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% "
    "endif %}{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', is_first_"
    "sp=true) %}{%- for message in messages %}{%- if message['role'] == 'system' %}{%- if ns.is_first_sp %}{% set n"
    "s.system_prompt = ns.system_prompt + message['content'] %}{% set ns.is_first_sp = false %}{%- else %}{% set ns"
    ".system_prompt = ns.system_prompt + '\\n\\n' + message['content'] %}{%- endif %}{%- endif %}{%- endfor %}{{bos"
    "_token}}{{ns.system_prompt}}{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.is_too"
    "l = false -%}{{'<｜User｜>' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' and message["
    "'content'] is none %}{%- set ns.is_tool = false -%}{%- for tool in message['tool_calls']%}{%- if not ns.is_fir"
    "st %}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function"
    "']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments'] + '\\n' + '```' + '<｜tool▁call▁end｜>'}}"
    "{%- set ns.is_first = true -%}{%- else %}{{'\\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + too"
    "l['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments'] + '\\n' + '```' + '<｜tool▁ca"
    "ll▁end｜>'}}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor %}{%- endif %}{%- if message['rol"
    "e'] == 'assistant' and message['content'] is not none %}{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message"
    "['content'] + '<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}{%- else %}{{'<｜Assistant｜>' + message['con"
    "tent'] + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}{%- if message['role'] == 'tool' %}{%- set ns.is_tool "
    "= true -%}{%- if ns.is_output_first %}{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '"
    "<｜tool▁output▁end｜>'}}{%- set ns.is_output_first = false %}{%- else %}{{'\\n<｜tool▁output▁begin｜>' + message['"
    "content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %}{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁"
    "end｜>'}}{% endif %}{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}\"\n"
    "}";

/* Training text for the merges (original prose and code, written for deepinfer). */
static const char k_corpus[] =
    "The quick brown fox jumps over the lazy dog while the small model learns to count. "
    "A language model reads a sequence of tokens and predicts the next one. Each token is a piece of text: "
    "a word, a part of a word, a number, a space or a punctuation mark. The tokenizer turns text into tokens "
    "and the detokenizer turns tokens back into text, byte for byte, so that nothing is lost on the way.\n"
    "In a mixture of experts, every token is sent to a few experts out of many. The router scores each expert, "
    "keeps the best groups, and then the best experts inside those groups. The shared expert always runs. "
    "The outputs are weighted by the router scores and added to the residual stream of the transformer.\n"
    "Attention looks back over the previous tokens. Multi-head latent attention stores a compressed latent "
    "vector for every position instead of the full keys and values, which makes the cache much smaller. "
    "Rotary position embeddings rotate pairs of query and key dimensions by an angle that grows with the "
    "position, and the YaRN method stretches those angles so that longer contexts still work.\n"
    "User: What is the capital of France?\nAssistant: The capital of France is Paris.\n"
    "User: Write a function that adds two numbers.\nAssistant: Here is a function in Python:\n"
    "def add(a, b):\n    return a + b\n\n"
    "int main(int argc, char **argv) {\n    for (int i = 0; i < argc; i++) printf(\"%s\\n\", argv[i]);\n    return 0;\n}\n"
    "The numbers 1, 2, 3, 10, 42, 100, 256, 1024 and 2048 appear in tests; 3.14159 is close to pi.\n"
    "Good tests check real behaviour: they compare with a reference, they fail when the code is wrong, "
    "and they run quickly. When a file is broken, the error message names the file, the field and what "
    "was expected, so the person who reads it knows what to fix.\n"
    "The weather today is sunny with a light wind from the west. Tomorrow there will be rain in the morning "
    "and clouds in the afternoon. People walk their dogs in the park, children play on the grass, and the "
    "old man on the bench reads his newspaper every day at the same time.\n"
    "Mathematics: the sum of the first n integers is n(n+1)/2, the square root of 2 is about 1.41421, and "
    "every even number greater than two is, as far as anyone has checked, the sum of two primes.\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Berlin\", \"unit\": \"celsius\"}}\n"
    "The engine schedules requests, batches them together, runs the model on the GPU, samples the next "
    "tokens and streams them back to the user. Continuous batching keeps the GPU busy; the prefix cache "
    "reuses work when many requests share the same beginning.\n"
    "Once upon a time there was a little robot who wanted to learn how to write stories. Every night it "
    "read a book, and every morning it tried to write a new sentence of its own. After many days the "
    "sentences became paragraphs, and the paragraphs became a story about a robot who learned to write.\n";

/* GPT-2 byte-level alphabet: byte b -> code point. */
static unsigned byte_cp(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return (unsigned)b;
    int n = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
    return 256u + (unsigned)n;
}

static size_t put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    o[0] = (char)(0xc0 | (cp >> 6));
    o[1] = (char)(0x80 | (cp & 0x3f));
    return 2; /* every code point of the alphabet is < 0x800 */
}

typedef struct tok_vocab {
    char **str;           /* token strings (byte-level alphabet, UTF-8) */
    int n, cap;
    di_strmap *ids;
} tok_vocab;

static int vocab_add(tok_vocab *v, const char *s) {
    int64_t id;
    if (di_strmap_get(v->ids, s, strlen(s), &id)) return (int)id;
    if (v->n == v->cap) {
        int nc = v->cap ? v->cap * 2 : 1024;
        char **ns = realloc(v->str, (size_t)nc * sizeof *ns);
        if (!ns) return -1;
        v->str = ns;
        v->cap = nc;
    }
    v->str[v->n] = strdup(s);
    if (!v->str[v->n] || di_strmap_put(v->ids, s, strlen(s), v->n) != 0) return -1;
    return v->n++;
}

/* Splits the corpus into pre-tokenizer-like pieces (an approximation of DeepSeek's regex:
 * digit runs of <= 3, an optional space + letters, an optional space + punctuation, spaces). */
static size_t next_piece(const char *s, size_t i, size_t n) {
    size_t j = i;
#define ISALPHA(c) (((c) >= 'a' && (c) <= 'z') || ((c) >= 'A' && (c) <= 'Z'))
#define ISDIGIT(c) ((c) >= '0' && (c) <= '9')
    if (ISDIGIT(s[j])) {
        while (j < n && ISDIGIT(s[j]) && j - i < 3) j++;
        return j;
    }
    if (s[j] == ' ' && j + 1 < n && s[j + 1] != ' ' && s[j + 1] != '\n' && !ISDIGIT(s[j + 1])) j++;
    if (ISALPHA(s[j])) {
        while (j < n && ISALPHA(s[j])) j++;
        return j;
    }
    if (s[j] == ' ' || s[j] == '\n') {
        while (j < n && (s[j] == ' ' || s[j] == '\n')) j++;
        return j;
    }
    while (j < n && !ISALPHA(s[j]) && !ISDIGIT(s[j]) && s[j] != ' ' && s[j] != '\n') j++;
    return j;
#undef ISALPHA
#undef ISDIGIT
}

typedef struct word { int *sym; int len; int count; } word;

typedef struct pair_count { uint64_t key; int64_t count; } pair_count;

/* Learns up to max_new tokens; appends "a b" merge strings to merges. */
static di_status train(tok_vocab *v, int max_new, json_t *merges) {
    const size_t n = strlen(k_corpus);
    di_strmap *wmap = di_strmap_create(1024);
    word *words = NULL;
    int nw = 0, cw = 0;
    di_status s = DI_OK;
    pair_count *tab = NULL;
    if (!wmap) return di_error(DI_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n;) {
        size_t j = next_piece(k_corpus, i, n);
        int64_t w;
        if (di_strmap_get(wmap, k_corpus + i, j - i, &w)) {
            words[w].count++;
        } else {
            if (nw == cw) {
                cw = cw ? cw * 2 : 256;
                word *nwp = realloc(words, (size_t)cw * sizeof *nwp);
                if (!nwp) { s = di_error(DI_ERR_NOMEM, "out of memory"); goto done; }
                words = nwp;
            }
            words[nw].sym = malloc((j - i) * sizeof(int));
            if (!words[nw].sym) { s = di_error(DI_ERR_NOMEM, "out of memory"); goto done; }
            words[nw].len = (int)(j - i);
            words[nw].count = 1;
            for (size_t k = i; k < j; k++) {
                char b[4];
                b[put_utf8(b, byte_cp((unsigned char)k_corpus[k]))] = '\0';
                int64_t id = 0;
                di_strmap_get(v->ids, b, strlen(b), &id);
                words[nw].sym[k - i] = (int)id;
            }
            di_strmap_put(wmap, k_corpus + i, j - i, nw);
            nw++;
        }
        i = j;
    }
    const size_t tab_cap = 1 << 16;
    tab = malloc(tab_cap * sizeof *tab);
    if (!tab) { s = di_error(DI_ERR_NOMEM, "out of memory"); goto done; }
    for (int added = 0; added < max_new;) {
        memset(tab, 0, tab_cap * sizeof *tab);
        uint64_t best = 0;
        int64_t best_count = 0;
        for (int w = 0; w < nw; w++)
            for (int k = 0; k + 1 < words[w].len; k++) {
                uint64_t key = ((uint64_t)(words[w].sym[k] + 1) << 32) | (uint64_t)(words[w].sym[k + 1] + 1);
                size_t h = (size_t)((key * 0x9e3779b97f4a7c15ull) >> 48) & (tab_cap - 1);
                while (tab[h].key && tab[h].key != key) h = (h + 1) & (tab_cap - 1);
                tab[h].key = key;
                tab[h].count += words[w].count;
                if (tab[h].count > best_count || (tab[h].count == best_count && key < best)) {
                    best_count = tab[h].count;
                    best = key;
                }
            }
        if (best_count < 2) break;
        int a = (int)(best >> 32) - 1, b = (int)(best & 0xffffffffu) - 1;
        size_t la = strlen(v->str[a]), lb = strlen(v->str[b]);
        char *cat = malloc(la + lb + 2);
        if (!cat) { s = di_error(DI_ERR_NOMEM, "out of memory"); goto done; }
        int before = v->n;
        memcpy(cat, v->str[a], la);
        memcpy(cat + la, v->str[b], lb + 1);
        int c = vocab_add(v, cat);
        cat[la] = ' ';
        memcpy(cat + la + 1, v->str[b], lb + 1);
        json_array_append_new(merges, json_string(cat));
        free(cat);
        if (c < 0) { s = di_error(DI_ERR_NOMEM, "out of memory"); goto done; }
        if (v->n > before) added++;
        for (int w = 0; w < nw; w++) {
            int o = 0;
            for (int k = 0; k < words[w].len; k++) {
                if (k + 1 < words[w].len && words[w].sym[k] == a && words[w].sym[k + 1] == b) {
                    words[w].sym[o++] = c;
                    k++;
                } else {
                    words[w].sym[o++] = words[w].sym[k];
                }
            }
            words[w].len = o;
        }
    }
done:
    for (int w = 0; w < nw; w++) free(words[w].sym);
    free(words);
    free(tab);
    di_strmap_free(wmap);
    return s;
}

static json_t *added_token(int id, const char *content, int special, int normalized) {
    json_t *t = json_object();
    json_object_set_new(t, "id", json_integer(id));
    json_object_set_new(t, "content", json_string(content));
    json_object_set_new(t, "single_word", json_false());
    json_object_set_new(t, "lstrip", json_false());
    json_object_set_new(t, "rstrip", json_false());
    json_object_set_new(t, "normalized", json_boolean(normalized));
    json_object_set_new(t, "special", json_boolean(special));
    return t;
}

static json_t *split(const char *regex) {
    json_t *o = json_object(), *p = json_object();
    json_object_set_new(o, "type", json_string("Split"));
    json_object_set_new(p, "Regex", json_string(regex));
    json_object_set_new(o, "pattern", p);
    json_object_set_new(o, "behavior", json_string("Isolated"));
    json_object_set_new(o, "invert", json_false());
    return o;
}

static json_t *byte_level(int add_prefix_space, int trim_offsets, int use_regex) {
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string("ByteLevel"));
    json_object_set_new(o, "add_prefix_space", json_boolean(add_prefix_space));
    json_object_set_new(o, "trim_offsets", json_boolean(trim_offsets));
    json_object_set_new(o, "use_regex", json_boolean(use_regex));
    return o;
}

static json_t *pre_tokenizer(void) {
    json_t *o = json_object(), *seq = json_array();
    json_object_set_new(o, "type", json_string("Sequence"));
    json_array_append_new(seq, split("\\p{N}{1,3}"));
    json_array_append_new(seq, split("[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-\xe3\x83\xbf]+"));
    json_array_append_new(seq, split("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
                                     "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"));
    json_array_append_new(seq, byte_level(0, 1, 0));
    json_object_set_new(o, "pretokenizers", seq);
    return o;
}

/* Added tokens above the learned vocabulary: content and `special` (all `normalized`, as in
 * DeepSeek-V3's file; the three low ones are special and not normalized). */
static const struct { const char *content; int special; } k_top_tokens[] = {
    {"<\xef\xbd\x9c" "fim\xe2\x96\x81hole\xef\xbd\x9c>", 0},
    {"<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", 0},
    {"<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>", 0},
    {"<\xef\xbd\x9cUser\xef\xbd\x9c>", 0},
    {"<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>", 0},
    {"<|EOT|>", 1},
    {"<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>", 0},
    {"<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>", 0},
    {"<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>", 0},
    {"<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>", 0},
    {"<\xef\xbd\x9ctool\xe2\x96\x81outputs\xe2\x96\x81" "begin\xef\xbd\x9c>", 0},
    {"<\xef\xbd\x9ctool\xe2\x96\x81outputs\xe2\x96\x81" "end\xef\xbd\x9c>", 0},
    {"<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81" "begin\xef\xbd\x9c>", 0},
    {"<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81" "end\xef\xbd\x9c>", 0},
    {"<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>", 0},
    {"<think>", 0},
    {"</think>", 0},
};
#define N_TOP ((int)(sizeof k_top_tokens / sizeof k_top_tokens[0]))

static const char *const k_low_tokens[3] = {
    "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
    "<\xef\xbd\x9c\xe2\x96\x81pad\xe2\x96\x81\xef\xbd\x9c>",
};

static json_t *build(int vocab_size, di_status *st) {
    tok_vocab v = {0};
    json_t *root = NULL, *merges = json_array(), *vocab = json_object(), *added = json_array();
    *st = DI_OK;
    v.ids = di_strmap_create(4096);
    if (!v.ids) { *st = di_error(DI_ERR_NOMEM, "out of memory"); goto done; }
    for (int i = 0; i < 3; i++) vocab_add(&v, k_low_tokens[i]);
    /* byte tokens in code point order of their alphabet characters */
    unsigned cps[256];
    for (int b = 0; b < 256; b++) cps[b] = byte_cp(b);
    for (unsigned cp = 0; cp < 512; cp++)
        for (int b = 0; b < 256; b++)
            if (cps[b] == cp) {
                char s[4];
                s[put_utf8(s, cp)] = '\0';
                vocab_add(&v, s);
            }
    if ((*st = train(&v, vocab_size - v.n - N_TOP, merges)) != DI_OK) goto done;
    for (int i = 0; i < v.n; i++) json_object_set_new(vocab, v.str[i], json_integer(i));
    for (int i = 0; i < 3; i++) json_array_append_new(added, added_token(i, k_low_tokens[i], 1, 0));
    for (int i = 0; i < N_TOP; i++) json_array_append_new(added, added_token(v.n + i, k_top_tokens[i].content, k_top_tokens[i].special, 1));
    root = json_object();
    json_object_set_new(root, "version", json_string("1.0"));
    json_object_set_new(root, "truncation", json_null());
    json_object_set_new(root, "padding", json_null());
    json_object_set_new(root, "added_tokens", added);
    added = NULL;
    json_t *norm = json_object();
    json_object_set_new(norm, "type", json_string("Sequence"));
    json_object_set_new(norm, "normalizers", json_array());
    json_object_set_new(root, "normalizer", norm);
    json_object_set_new(root, "pre_tokenizer", pre_tokenizer());
    json_object_set_new(root, "post_processor", byte_level(1, 0, 1));
    json_object_set_new(root, "decoder", byte_level(1, 1, 1));
    json_t *model = json_object();
    json_object_set_new(model, "type", json_string("BPE"));
    json_object_set_new(model, "dropout", json_null());
    json_object_set_new(model, "unk_token", json_null());
    json_object_set_new(model, "continuing_subword_prefix", json_null());
    json_object_set_new(model, "end_of_word_suffix", json_null());
    json_object_set_new(model, "fuse_unk", json_false());
    json_object_set_new(model, "byte_fallback", json_false());
    json_object_set_new(model, "vocab", vocab);
    json_object_set_new(model, "merges", merges);
    vocab = merges = NULL;
    json_object_set_new(root, "model", model);
done:
    json_decref(merges);
    json_decref(vocab);
    json_decref(added);
    for (int i = 0; i < v.n; i++) free(v.str[i]);
    free(v.str);
    di_strmap_free(v.ids);
    return root;
}

di_status di_mkmodel_write_tokenizer(int vocab_size, const char *dir) {
    if (vocab_size < 3 + 256 + N_TOP)
        return di_error(DI_ERR_INVALID_ARG, "mkmodel: vocab_size %d is too small for the byte-level tokenizer (needs >= %d)",
                        vocab_size, 3 + 256 + N_TOP);
    di_status s;
    json_t *root = build(vocab_size, &s);
    if (!root) return s;
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    char *p1 = di_path_join(dir, "tokenizer.json"), *p2 = di_path_join(dir, "tokenizer_config.json");
    if (!text || !p1 || !p2) s = di_error(DI_ERR_NOMEM, "out of memory");
    else {
        size_t l = strlen(text);
        text[l] = '\n';
        s = di_write_file(p1, text, l + 1);
        if (s == DI_OK) s = di_write_file(p2, k_tokenizer_config, sizeof k_tokenizer_config - 1);
    }
    free(text);
    free(p1);
    free(p2);
    return s;
}
