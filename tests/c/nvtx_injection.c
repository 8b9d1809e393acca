/* A fake NVTX v3 tool (the kind of library nsys names in NVTX_INJECTION64_PATH) for
 * tests/nvtx.rs: it attaches through InitializeInjectionNvtx2 and the payload extension as a real
 * tool does, with its own declarations of the protocol's tables (docs/PLUGINS.md, "NVTX"), and
 * records every domain, range push and pop into a log the test reads with fake_nvtx_log(): one line
 * per event, a push decoded through the payload schemas registered with it. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef void (*fnptr)(void);
typedef const void* (*get_export_table_t)(uint32_t id);
typedef struct {
  size_t struct_size;
  int (*get_module_function_table)(int module, fnptr*** table, unsigned int* size);
} callbacks_t;

typedef struct {
  uint16_t version, size;
  uint32_t category;
  int32_t color_type;
  uint32_t color;
  int32_t payload_type, reserved0;
  uint64_t payload;
  int32_t message_type;
  const void* message;
} attr_t;

typedef struct { uint64_t schema_id; size_t size; const void* payload; } payload_data_t;
typedef struct {
  uint64_t flags, type;
  const char *name, *description;
  uint64_t array_or_union_detail, offset;
  const void *semantics, *reserved;
} schema_entry_t;
typedef struct {
  uint64_t field_mask;
  const char* name;
  uint64_t type, flags;
  const schema_entry_t* entries;
  size_t num_entries, payload_static_size, pack_align;
  uint64_t schema_id;
  void* extension;
} schema_attr_t;
typedef struct { const char* name; uint64_t value; int8_t is_flag; } enum_entry_t;
typedef struct {
  uint64_t field_mask;
  const char* name;
  const enum_entry_t* entries;
  size_t num_entries, size_of_enum;
  uint64_t schema_id;
  void* extension;
} enum_attr_t;
typedef struct { size_t segment_id, slot_count; intptr_t* slots; } segment_t;
typedef struct {
  uint16_t nvtx_ver, struct_size, module_id, compat_id;
  size_t segments_count;
  segment_t* segments;
  void* get_export_function;
  const uint16_t (*type_info)[2];
} module_info_t;

#define PAYLOAD_TYPE_EXT ((int32_t)0xDFBD0009)
#define MAX_SCHEMAS 32
#define MAX_FIELDS 8

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char log_buf[1 << 16];
static size_t log_len;
static char domain_name[64];
static struct { uint64_t id; size_t n, size; char names[MAX_FIELDS][64]; uint64_t types[MAX_FIELDS], offsets[MAX_FIELDS]; } schemas[MAX_SCHEMAS];
static size_t n_schemas;
static struct { uint64_t id; char names[8][16]; size_t n; } redop;
static int type_info_ok;

static void logf_(const char* fmt, const char* a, const char* b) {
  if (log_len < sizeof(log_buf)) log_len += snprintf(log_buf + log_len, sizeof(log_buf) - log_len, fmt, a, b);
  if (log_len > sizeof(log_buf)) log_len = sizeof(log_buf);
}

const char* fake_nvtx_log(void) { return log_buf; }

static void* domain_create(const char* name) {
  pthread_mutex_lock(&lock);
  snprintf(domain_name, sizeof domain_name, "%s", name);
  logf_("domain %s%s\n", name, "");
  pthread_mutex_unlock(&lock);
  return (void*)domain_name;
}

/* A registered string's handle is the string itself, copied. */
static void* register_string(void* domain, const char* s) {
  (void)domain;
  return (void*)strdup(s);
}

static void describe(const payload_data_t* d, char* out, size_t cap) {
  size_t len = 0;
  out[0] = 0;
  for (size_t i = 0; i < n_schemas; i++) {
    if (schemas[i].id != d->schema_id) continue;
    if (d->size != schemas[i].size) { snprintf(out, cap, " (payload of %zu bytes for a %zu-byte schema)", d->size, schemas[i].size); return; }
    for (size_t f = 0; f < schemas[i].n && len < cap; f++) {
      const char* p = (const char*)d->payload + schemas[i].offsets[f];
      uint64_t t = schemas[i].types[f];
      if (t == 18 || t == 22) {
        uint64_t v; memcpy(&v, p, 8);
        len += snprintf(out + len, cap - len, " %s=%llu", schemas[i].names[f], (unsigned long long)v);
      } else if (t == 5) {
        int v; memcpy(&v, p, 4);
        len += snprintf(out + len, cap - len, " %s=%d", schemas[i].names[f], v);
      } else if (t == redop.id) {
        int v; memcpy(&v, p, 4);
        len += snprintf(out + len, cap - len, " %s=%s", schemas[i].names[f], v >= 0 && (size_t)v < redop.n ? redop.names[v] : "?");
      } else {
        len += snprintf(out + len, cap - len, " %s=(type %llu)", schemas[i].names[f], (unsigned long long)t);
      }
    }
    return;
  }
  snprintf(out, cap, " (unregistered schema %llu)", (unsigned long long)d->schema_id);
}

static int push(void* domain, const attr_t* a) {
  char what[512] = "";
  const char* name = a->message_type == 1 || a->message_type == 3 ? (const char*)a->message : "?";
  pthread_mutex_lock(&lock);
  if (a->payload_type == PAYLOAD_TYPE_EXT && a->reserved0 == 1) describe((const payload_data_t*)(uintptr_t)a->payload, what, sizeof what);
  if (a->size != sizeof(attr_t) || a->version != 3) snprintf(what, sizeof what, " (bad attributes)");
  logf_("push %s", domain == (void*)domain_name ? domain_name : "?", "");
  logf_(" %s%s\n", name, what);
  pthread_mutex_unlock(&lock);
  return 0;
}

static int pop(void* domain) {
  pthread_mutex_lock(&lock);
  logf_("pop %s%s\n", domain == (void*)domain_name ? domain_name : "?", "");
  pthread_mutex_unlock(&lock);
  return 0;
}

int InitializeInjectionNvtx2(get_export_table_t get) {
  const callbacks_t* cb = (const callbacks_t*)get(1);
  fnptr** table = 0;
  unsigned int size = 0;
  if (!cb || cb->struct_size < sizeof(callbacks_t) || !cb->get_module_function_table(5, &table, &size) || size < 13)
    return 0;
  *table[4] = (fnptr)push;
  *table[5] = (fnptr)pop;
  *table[10] = (fnptr)register_string;
  *table[12] = (fnptr)domain_create;
  return 1;
}

static uint64_t schema_register(void* domain, const schema_attr_t* a) {
  (void)domain;
  pthread_mutex_lock(&lock);
  if (n_schemas < MAX_SCHEMAS && a->num_entries <= MAX_FIELDS) {
    schemas[n_schemas].id = a->schema_id;
    schemas[n_schemas].n = a->num_entries;
    schemas[n_schemas].size = a->payload_static_size;
    for (size_t i = 0; i < a->num_entries; i++) {
      snprintf(schemas[n_schemas].names[i], 64, "%s", a->entries[i].name);
      schemas[n_schemas].types[i] = a->entries[i].type;
      schemas[n_schemas].offsets[i] = a->entries[i].offset;
    }
    n_schemas++;
  }
  pthread_mutex_unlock(&lock);
  return a->schema_id;
}

static uint64_t enum_register(void* domain, const enum_attr_t* a) {
  (void)domain;
  pthread_mutex_lock(&lock);
  redop.id = a->schema_id;
  redop.n = a->num_entries < 8 ? a->num_entries : 8;
  for (size_t i = 0; i < redop.n; i++) snprintf(redop.names[a->entries[i].value & 7], 16, "%s", a->entries[i].name);
  pthread_mutex_unlock(&lock);
  return a->schema_id;
}

int InitializeInjectionNvtxExtension(module_info_t* m) {
  if (m->module_id != 2 || m->segments_count != 1 || m->segments[0].slot_count < 2) return 0;
  /* The type table: 28 entries, uint64_t (18) and size_t (22) of 8 bytes. */
  type_info_ok = m->type_info[0][0] == 28 && m->type_info[18][0] == 8 && m->type_info[22][0] == 8;
  if (!type_info_ok) return 0;
  m->segments[0].slots[0] = (intptr_t)schema_register;
  m->segments[0].slots[1] = (intptr_t)enum_register;
  return 1;
}
