/*
 * A stand-in libnvidia-ml.so.1 driven by a node profile, so that the real NVML bindings (pynvml) can be
 * exercised on machines without NVIDIA GPUs.
 *
 * Environment:
 *   NVML_SIM_PROFILE    node profile (JSON, or YAML converted once per process, when the library is loaded,
 *                       by NVML_SIM_PYTHON running to_json.py); unset -> nvmlInit returns
 *                       NVML_ERROR_DRIVER_NOT_LOADED.
 *   NVML_SIM_STATE_DIR  (created at init if missing) run-time state shared between processes, read at each
 *                       call: lost/<uuid> and unanswering/<uuid> markers, compute-mode/<uuid>, the health
 *                       files (retired-pending/, remap-pending/, remap-failed/, ecc-volatile/, ecc-aggregate/,
 *                       recovery-action/), and the append-only `events` file ("<uuid> <xid>" per line).
 *   NVML_SIM_FAIL_INIT  make nvmlInit fail: driver_not_loaded, lib_rm_version_mismatch, no_permission,
 *                       unknown, or a numeric NVML return code; `hang`: nvmlInit never returns (a hung driver).
 *   NVML_SIM_PYTHON     interpreter used for YAML profiles (default python3).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdint.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "json.h"

#ifndef NVML_SIM_TO_JSON
#define NVML_SIM_TO_JSON "to_json.py"
#endif

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 64
#define MAX_MIG 7
#define MAX_LINKS 36
#define EV_XID 0x8ULL
#define EV_SUPPORTED (0x1ULL | 0x2ULL | 0x8ULL) /* single/double bit ECC, XID critical error */
#define NO_ID 0xFFFFFFFFu

typedef struct sim_handle {
    unsigned magic;
    int gpu; /* index into g.gpus */
    int mig; /* -1 for a full GPU */
} sim_handle;
typedef sim_handle *nvmlDevice_t;

/* nvmlGpuInstance_t: the GPU instance of a MIG device (the first device listed with that gi_id). */
typedef struct sim_gi {
    unsigned magic;
    int gpu, mig;
} sim_gi;
typedef sim_gi *nvmlGpuInstance_t;

typedef struct {
    sim_handle h;
    sim_gi gi_handle;
    char uuid[96];
    char profile[32];
    unsigned gi, ci;
    unsigned long long mem;
    int gi_profile_id; /* -1: unknown, nvmlDeviceGetGpuInstanceById answers NOT_SUPPORTED */
    int placement_start, placement_size; /* -1 until given or derived */
} sim_mig;

typedef struct {
    sim_handle h;
    char uuid[96];
    char name[96];
    char bus_id[32];
    unsigned long long mem;
    int cc_major, cc_minor;
    unsigned minor;
    int numa; /* -1: not reported */
    int mig_capable, mig_enabled, mig_pending;
    int n_mig;
    sim_mig mig[MAX_MIG];
    int n_links;
    int link_remote[MAX_LINKS]; /* GPU index, or -1 for an NVSwitch */
    int compute_mode;           /* used when no state dir is set */
    int events_supported;
    int fabric_state;           /* 0: no fabric (NOT_SUPPORTED); else nvmlGpuFabricState_t */
    unsigned char cluster_uuid[16];
    unsigned clique_id;
    int brand;     /* nvmlBrandType_t */
    unsigned arch; /* nvmlDeviceArchitecture_t */
    int addressing; /* 0: NOT_SUPPORTED (no mode to report); else nvmlDeviceAddressingModeType_t + 1 */
} sim_gpu;

#define HANDLE_MAGIC 0x4e564d4cu
#define GI_MAGIC 0x47494e53u
#define EVSET_MAGIC 0x45565354u

static struct {
    pthread_mutex_t lock;
    int refcount;
    char driver[80];
    int cuda_version; /* 12040 for 12.4 */
    int n;
    sim_gpu gpus[MAX_GPUS];
    int pcie[MAX_GPUS][MAX_GPUS];
    char state_dir[1024];
} g = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* ---------------------------------------------------------------- profile loading */

static char load_err[512];

__attribute__((format(printf, 1, 2))) static int perr(const char *fmt, ...) {
    if (!load_err[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(load_err, sizeof load_err, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static char *read_all(int fd) {
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) return NULL;
    for (;;) {
        if (n == cap) {
            cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        n += (size_t)r;
    }
    buf[n] = '\0';
    return buf;
}

/* YAML is turned into JSON by a small Python script rather than parsed here. */
static char *yaml_to_json(const char *path) {
    const char *py = getenv("NVML_SIM_PYTHON");
    const char *script = getenv("NVML_SIM_TO_JSON");
    if (!py || !*py) py = "python3";
    if (!script || !*script) script = NVML_SIM_TO_JSON;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) < 0) return NULL;
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return NULL;
    }
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        execlp(py, py, script, path, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    char *out = read_all(fds[0]);
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        snprintf(load_err, sizeof load_err, "%s %s %s failed (exit status %d)", py, script, path,
                 WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        free(out);
        return NULL;
    }
    return out;
}

static int get_str(const jvalue *obj, const char *key, char *dst, size_t len, const char *where, int i) {
    const jvalue *v = json_get(obj, key);
    if (!v || v->type != J_STR) {
        char what[128];
        snprintf(what, sizeof what, "%s.%s", where, key);
        return perr("%s[%d]: missing or not a string", what, i);
    }
    snprintf(dst, len, "%s", v->str);
    return 0;
}

static int get_num(const jvalue *obj, const char *key, double *dst, int required, const char *where, int i) {
    const jvalue *v = json_get(obj, key);
    if (!v || v->type == J_NULL) {
        if (!required) return 1;
        char what[128];
        snprintf(what, sizeof what, "%s.%s", where, key);
        return perr("%s[%d]: missing", what, i);
    }
    if (v->type != J_NUM && v->type != J_BOOL) {
        char what[128];
        snprintf(what, sizeof what, "%s.%s", where, key);
        return perr("%s[%d]: not a number", what, i);
    }
    *dst = v->num;
    return 0;
}

static int level_value(const char *name) {
    static const char *names[] = {"internal", "single", "multiple", "hostbridge", "node", "system"};
    for (int i = 0; i < 6; i++)
        if (strcmp(name, names[i]) == 0) return i * 10;
    return -1;
}

static int compute_mode_value(const char *name) {
    if (strcmp(name, "DEFAULT") == 0) return 0;
    if (strcmp(name, "EXCLUSIVE_THREAD") == 0) return 1;
    if (strcmp(name, "PROHIBITED") == 0) return 2;
    if (strcmp(name, "EXCLUSIVE_PROCESS") == 0) return 3;
    return -1;
}

static const char *compute_mode_name(int mode) {
    static const char *names[] = {"DEFAULT", "EXCLUSIVE_THREAD", "PROHIBITED", "EXCLUSIVE_PROCESS"};
    return mode >= 0 && mode < 4 ? names[mode] : "DEFAULT";
}

static int add_link(int a, int b) {
    sim_gpu *ga = &g.gpus[a];
    if (ga->n_links >= MAX_LINKS) return perr("nvlinks: GPU %d has more than 36 NVLink links", a);
    ga->link_remote[ga->n_links++] = b;
    return 0;
}

/* go-nvlib's GetBrandAsString / GetArchitectureAsString names, indexed by the NVML enum value. */
static const char *brand_names[] = {"Unknown", "Quadro", "Tesla", "NVS", "Grid", "GeForce", "Titan",
                                    "NvidiaVApps", "NvidiaVPC", "NvidiaVCS", "NvidiaVWS", "NvidiaCloudGaming",
                                    "QuadroRTX", "NvidiaRTX", "Nvidia", "GeForceRTX", "TitanRTX"};
static const char *arch_names[] = {NULL, NULL, "Kepler", "Maxwell", "Pascal", "Volta", "Turing", "Ampere",
                                   "Ada Lovelace", "Hopper", "Blackwell"};
#define ARCH_UNKNOWN 0xFFFFFFFFu
/* go-nvlib's GetAddressingModeAsString names, indexed by nvmlDeviceAddressingModeType_t. */
static const char *addressing_names[] = {"None", "HMM", "ATS"};

static int name_index(const char *const *names, int n, const char *name) {
    for (int k = 0; k < n; k++)
        if (names[k] && strcmp(names[k], name) == 0) return k;
    return -1;
}

/* The architecture of a compute capability, as nvdp.inventory.facts.architecture_from_cc. */
static unsigned arch_from_cc(int major, int minor) {
    switch (major) {
    case 3: return 2;
    case 5: return 3;
    case 6: return 4;
    case 7: return minor >= 5 ? 6 : 5;
    case 8: return minor == 9 ? 8 : 7;
    case 9: return 9;
    case 10: case 11: case 12: return 10;
    default: return ARCH_UNKNOWN;
    }
}

/* Compute slices, memory GB and whether a suffix follows, from "[<c>c.]<g>g.<gb>gb[suffix]". */
static int parse_mig_profile(const char *profile, unsigned *g_slices, unsigned *gb, int *suffix) {
    unsigned c;
    int n = 0;
    if (sscanf(profile, "%uc.%n", &c, &n) == 1 && n > 0) profile += n;
    n = 0;
    if (sscanf(profile, "%ug.%ugb%n", g_slices, gb, &n) != 2 || n == 0) return -1;
    *suffix = profile[n] != '\0';
    return 0;
}

/* Memory slices (eighths of the GPU's memory, rounded, at least 1), as nvdp.inventory.facts. */
static int mig_memory_slices(const char *profile, unsigned long long gpu_mem) {
    unsigned g_slices, gb;
    int suffix;
    unsigned long long gpu_gb = (gpu_mem / (1024ULL * 1024ULL) + 512) / 1024;
    if (parse_mig_profile(profile, &g_slices, &gb, &suffix) < 0 || gpu_gb == 0) return -1;
    unsigned long long slices = ((unsigned long long)gb * 16 + gpu_gb) / (2 * gpu_gb);
    return slices < 1 ? 1 : (int)slices;
}

/* NVIDIA's A100/H100 GI profile ids (nvidia-smi mig -lgip); -1 for sizes without one. */
static int default_gi_profile_id(const char *profile, unsigned long long gpu_mem) {
    unsigned g_slices, gb;
    int suffix;
    if (parse_mig_profile(profile, &g_slices, &gb, &suffix) < 0) return -1;
    if (g_slices == 1 && suffix) return 20;
    if (g_slices == 1) return mig_memory_slices(profile, gpu_mem) >= 2 ? 15 : 19;
    switch (g_slices) {
    case 2: return 14;
    case 3: return 9;
    case 4: return 5;
    case 7: return 0;
    default: return -1;
    }
}

static int overlaps_placed(const sim_gpu *gp, int self, int start, int size) {
    for (int k = 0; k < gp->n_mig; k++) {
        const sim_mig *o = &gp->mig[k];
        if (k == self || o->placement_start < 0 || o->gi == gp->mig[self].gi) continue;
        if (start < o->placement_start + o->placement_size && o->placement_start < start + size) return 1;
    }
    return 0;
}

/* GPU instance facts of each MIG device: as given, else derived; compute instances of one GPU instance
 * (same gi_id) share the first one's. Placements not given are packed, in list order, at the lowest
 * start that is a multiple of their size and overlaps no other GPU instance (sim/nvml/README.md). */
static void place_mig_devices(sim_gpu *gp) {
    for (int j = 0; j < gp->n_mig; j++) {
        sim_mig *m = &gp->mig[j];
        int first = j;
        for (int k = 0; k < j; k++)
            if (gp->mig[k].gi == m->gi) {
                first = k;
                break;
            }
        if (first != j) {
            m->gi_profile_id = gp->mig[first].gi_profile_id;
            m->placement_start = gp->mig[first].placement_start;
            m->placement_size = gp->mig[first].placement_size;
            continue;
        }
        if (m->gi_profile_id < 0 || m->placement_start >= 0) continue;
        int start = 0;
        while (overlaps_placed(gp, j, start, m->placement_size)) start += m->placement_size;
        m->placement_start = start;
    }
}

static int load_gpu(const jvalue *jg, int i) {
    sim_gpu *gp = &g.gpus[i];
    double d;
    memset(gp, 0, sizeof *gp);
    gp->h = (sim_handle){HANDLE_MAGIC, i, -1};
    gp->numa = -1;
    gp->events_supported = 1;
    if (jg->type != J_OBJ) return perr("%s[%d]: not a mapping", "gpus", i);
    if (get_str(jg, "uuid", gp->uuid, sizeof gp->uuid, "gpus", i) < 0) return -1;
    if (get_str(jg, "name", gp->name, sizeof gp->name, "gpus", i) < 0) return -1;
    if (get_str(jg, "pci_bus_id", gp->bus_id, sizeof gp->bus_id, "gpus", i) < 0) return -1;
    if (get_num(jg, "memory_mib", &d, 1, "gpus", i) < 0) return -1;
    gp->mem = (unsigned long long)d * 1024ULL * 1024ULL;
    char cc[16];
    if (get_str(jg, "compute_capability", cc, sizeof cc, "gpus", i) < 0) return -1;
    if (sscanf(cc, "%d.%d", &gp->cc_major, &gp->cc_minor) != 2)
        return perr("gpus[%d].compute_capability: expected \"major.minor\"", i);
    if (get_num(jg, "minor", &d, 1, "gpus", i) < 0) return -1;
    gp->minor = (unsigned)d;
    const jvalue *brand = json_get(jg, "brand");
    gp->brand = strstr(gp->name, "Tesla") ? 2 : 14; /* NVML_BRAND_TESLA, NVML_BRAND_NVIDIA */
    if (brand && brand->type == J_STR && (gp->brand = name_index(brand_names, 17, brand->str)) < 0)
        return perr("gpus[%d].brand: unknown brand %s", i, brand->str);
    const jvalue *arch = json_get(jg, "architecture");
    gp->arch = arch_from_cc(gp->cc_major, gp->cc_minor);
    if (arch && arch->type == J_STR) {
        int a = strcmp(arch->str, "Unknown") == 0 ? 0 : name_index(arch_names, 11, arch->str);
        if (a < 0) return perr("gpus[%d].architecture: unknown architecture %s", i, arch->str);
        gp->arch = a == 0 ? ARCH_UNKNOWN : (unsigned)a;
    }
    if (get_num(jg, "numa_node", &d, 0, "gpus", i) == 0) gp->numa = (int)d;
    if (get_num(jg, "mig_capable", &d, 0, "gpus", i) == 0) gp->mig_capable = (int)d;
    if (get_num(jg, "mig_enabled", &d, 0, "gpus", i) == 0) gp->mig_enabled = (int)d;
    gp->mig_pending = gp->mig_enabled;
    if (get_num(jg, "mig_pending", &d, 0, "gpus", i) == 0) gp->mig_pending = (int)d;
    if (get_num(jg, "xid_events", &d, 0, "gpus", i) == 0) gp->events_supported = (int)d;
    const jvalue *cm = json_get(jg, "compute_mode");
    if (cm && cm->type == J_STR) {
        gp->compute_mode = compute_mode_value(cm->str);
        if (gp->compute_mode < 0) return perr("gpus[%d].compute_mode: unknown mode", i);
    }
    const jvalue *fabric = json_get(jg, "fabric");
    if (fabric && fabric->type == J_OBJ) {
        char cluster[40], state[16] = "completed";
        if (get_str(fabric, "cluster_uuid", cluster, sizeof cluster, "gpus", i) < 0) return -1;
        unsigned b[16];
        if (sscanf(cluster, "%2x%2x%2x%2x-%2x%2x-%2x%2x-%2x%2x-%2x%2x%2x%2x%2x%2x", &b[0], &b[1], &b[2],
                   &b[3], &b[4], &b[5], &b[6], &b[7], &b[8], &b[9], &b[10], &b[11], &b[12], &b[13], &b[14],
                   &b[15]) != 16)
            return perr("gpus[%d].fabric.cluster_uuid: expected a UUID", i);
        for (int k = 0; k < 16; k++) gp->cluster_uuid[k] = (unsigned char)b[k];
        if (get_num(fabric, "clique_id", &d, 1, "gpus", i) < 0) return -1;
        gp->clique_id = (unsigned)d;
        const jvalue *st = json_get(fabric, "state");
        if (st && st->type == J_STR) snprintf(state, sizeof state, "%s", st->str);
        if (!strcmp(state, "not_started")) gp->fabric_state = 1;
        else if (!strcmp(state, "in_progress")) gp->fabric_state = 2;
        else if (!strcmp(state, "completed")) gp->fabric_state = 3;
        else return perr("gpus[%d].fabric.state: not_started, in_progress or completed", i);
    }
    const jvalue *addressing = json_get(jg, "addressing_mode");
    if (addressing && addressing->type == J_STR) {
        int a = name_index(addressing_names, 3, addressing->str);
        if (a < 0) return perr("gpus[%d].addressing_mode: None, HMM or ATS, got %s", i, addressing->str);
        gp->addressing = a + 1;
    }
    const jvalue *migs = json_get(jg, "mig_devices");
    if (migs && migs->type == J_ARR) {
        if (migs->len > MAX_MIG) return perr("gpus[%d].mig_devices: more than 7", i);
        for (size_t j = 0; j < migs->len; j++) {
            const jvalue *jm = &migs->items[j];
            sim_mig *m = &gp->mig[j];
            m->h = (sim_handle){HANDLE_MAGIC, i, (int)j};
            if (get_str(jm, "uuid", m->uuid, sizeof m->uuid, "mig_devices", (int)j) < 0) return -1;
            if (get_str(jm, "profile", m->profile, sizeof m->profile, "mig_devices", (int)j) < 0) return -1;
            if (get_num(jm, "gi_id", &d, 1, "mig_devices", (int)j) < 0) return -1;
            m->gi = (unsigned)d;
            if (get_num(jm, "ci_id", &d, 1, "mig_devices", (int)j) < 0) return -1;
            m->ci = (unsigned)d;
            if (get_num(jm, "memory_mib", &d, 1, "mig_devices", (int)j) < 0) return -1;
            m->mem = (unsigned long long)d * 1024ULL * 1024ULL;
            m->gi_handle = (sim_gi){GI_MAGIC, i, (int)j};
            m->gi_profile_id = default_gi_profile_id(m->profile, gp->mem);
            if (get_num(jm, "gi_profile_id", &d, 0, "mig_devices", (int)j) == 0) m->gi_profile_id = (int)d;
            m->placement_size = mig_memory_slices(m->profile, gp->mem);
            if (m->placement_size < 1) m->placement_size = 1;
            if (get_num(jm, "placement_size", &d, 0, "mig_devices", (int)j) == 0) m->placement_size = (int)d;
            m->placement_start = -1;
            if (get_num(jm, "placement_start", &d, 0, "mig_devices", (int)j) == 0) m->placement_start = (int)d;
        }
        gp->n_mig = (int)migs->len;
        place_mig_devices(gp);
    }
    return 0;
}

static int int_list(const jvalue *v, int *out, int max) {
    if (!v || v->type != J_ARR || (int)v->len > max) return -1;
    for (size_t k = 0; k < v->len; k++) {
        if (v->items[k].type != J_NUM) return -1;
        out[k] = (int)v->items[k].num;
        if (out[k] < 0 || out[k] >= g.n) return -1;
    }
    return (int)v->len;
}

static int load_topology(const jvalue *root) {
    int ids[MAX_GPUS];
    const jvalue *pcie = json_get(root, "pcie");
    int def = 50;
    const jvalue *groups = NULL;
    if (pcie && pcie->type == J_OBJ) {
        const jvalue *dv = json_get(pcie, "default");
        if (dv && dv->type == J_STR && (def = level_value(dv->str)) < 0)
            return perr("pcie.default: unknown level %s", dv->str);
        groups = json_get(pcie, "groups");
    }
    for (int a = 0; a < g.n; a++)
        for (int b = 0; b < g.n; b++) g.pcie[a][b] = a == b ? 0 : def;
    for (size_t k = 0; groups && groups->type == J_ARR && k < groups->len; k++) {
        const jvalue *gr = &groups->items[k];
        int n = int_list(json_get(gr, "gpus"), ids, MAX_GPUS);
        const jvalue *lv = json_get(gr, "level");
        int level = lv && lv->type == J_STR ? level_value(lv->str) : -1;
        if (n < 0 || level < 0) return perr("pcie.groups[%d]: needs gpus (indices) and a known level", (int)k);
        for (int x = 0; x < n; x++)
            for (int y = 0; y < n; y++)
                if (ids[x] != ids[y]) g.pcie[ids[x]][ids[y]] = level;
    }
    const jvalue *links = json_get(root, "nvlinks");
    for (size_t k = 0; links && links->type == J_ARR && k < links->len; k++) {
        const jvalue *lk = &links->items[k];
        double count;
        int n = int_list(json_get(lk, "gpus"), ids, 2);
        if (n != 2 || get_num(lk, "links", &count, 1, "nvlinks", (int)k) < 0)
            return perr("nvlinks[%d]: needs gpus (two indices) and links", (int)k);
        for (int c = 0; c < (int)count; c++)
            if (add_link(ids[0], ids[1]) < 0 || add_link(ids[1], ids[0]) < 0) return -1;
    }
    const jvalue *sw = json_get(root, "nvswitch");
    if (sw && sw->type == J_OBJ) {
        double per_gpu;
        if (get_num(sw, "links_per_gpu", &per_gpu, 1, "nvswitch", 0) < 0) return -1;
        const jvalue *members = json_get(sw, "gpus");
        int n = g.n;
        if (members && members->type != J_NULL) {
            n = int_list(members, ids, MAX_GPUS);
            if (n < 0) return perr("nvswitch.gpus: expected GPU indices");
        } else {
            for (int x = 0; x < n; x++) ids[x] = x;
        }
        for (int x = 0; x < n; x++)
            for (int c = 0; c < (int)per_gpu; c++)
                if (add_link(ids[x], -1) < 0) return -1;
    }
    return 0;
}

static char *converted_yaml, converted_path[1024];

static void convert_yaml(const char *path) {
    free(converted_yaml);
    converted_yaml = yaml_to_json(path);
    snprintf(converted_path, sizeof converted_path, "%s", converted_yaml ? path : "");
}

static int is_yaml(const char *path) {
    size_t plen = strlen(path);
    return (plen > 5 && strcmp(path + plen - 5, ".yaml") == 0) || (plen > 4 && strcmp(path + plen - 4, ".yml") == 0);
}

/* Up front, when the library is loaded (before the process starts threads of its own), rather than inside
 * whichever nvmlInit comes first: forking an interpreter from a threaded process is slow and can fail. */
__attribute__((constructor)) static void convert_profile_at_load(void) {
    const char *profile = getenv("NVML_SIM_PROFILE");
    if (profile && *profile && is_yaml(profile) && access(profile, R_OK) == 0) convert_yaml(profile);
}

static int load_profile(const char *path) {
    char *text = NULL;
    if (is_yaml(path)) {
        if (access(path, R_OK) != 0) return perr("cannot read profile %s", path);
        /* Converted once per process: a later nvmlInit (from any thread) reuses the JSON instead of
         * forking an interpreter again. */
        if (!converted_yaml || strcmp(converted_path, path) != 0) convert_yaml(path);
        text = converted_yaml ? strdup(converted_yaml) : NULL;
    } else {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return perr("cannot read profile %s", path);
        text = read_all(fd);
        close(fd);
    }
    if (!text) return perr("cannot convert profile %s", path);
    char jerr[256];
    jvalue *root = json_parse(text, jerr, sizeof jerr);
    free(text);
    if (!root) return perr("profile is not valid JSON: %s", jerr);
    int rc = -1;
    const jvalue *gpus = json_get(root, "gpus");
    if (root->type != J_OBJ) {
        perr("profile: top level must be a mapping");
    } else if (get_str(root, "driver_version", g.driver, sizeof g.driver, "profile", 0) == 0) {
        char cuda[16];
        int maj = 0, min = 0;
        if (get_str(root, "cuda_driver_version", cuda, sizeof cuda, "profile", 0) == 0 &&
            sscanf(cuda, "%d.%d", &maj, &min) >= 1) {
            g.cuda_version = maj * 1000 + min * 10;
            g.n = 0;
            if (gpus && gpus->type == J_ARR && gpus->len <= MAX_GPUS) {
                rc = 0;
                for (size_t i = 0; i < gpus->len && rc == 0; i++) {
                    rc = load_gpu(&gpus->items[i], (int)i);
                    g.n = (int)i + 1;
                }
                if (rc == 0) rc = load_topology(root);
            } else {
                perr("profile.gpus: missing, not a list, or more than 64 entries");
            }
        }
    }
    json_free(root);
    return rc;
}

/* ---------------------------------------------------------------- run-time state */

static int state_path(char *dst, size_t len, const char *sub, const char *uuid) {
    if (!g.state_dir[0]) return -1;
    if (uuid)
        snprintf(dst, len, "%s/%s/%s", g.state_dir, sub, uuid);
    else
        snprintf(dst, len, "%s/%s", g.state_dir, sub);
    return 0;
}

/* mkdir -p of the state directory, so a fresh node (or a hostPath nobody prepared) just works. */
static void make_state_dir(void) {
    char path[sizeof g.state_dir];
    if (!g.state_dir[0]) return;
    snprintf(path, sizeof path, "%s", g.state_dir);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        mkdir(path, 0755);
        *p = '/';
    }
    if (mkdir(path, 0755) < 0 && errno != EEXIST)
        fprintf(stderr, "nvml-sim: cannot create NVML_SIM_STATE_DIR %s: %s\n", path, strerror(errno));
}

/* A marker file <state dir>/<sub>/<uuid of GPU i> exists; read at each call, other processes set them. */
static int gpu_marked(int i, const char *sub) {
    char path[1200];
    if (state_path(path, sizeof path, sub, g.gpus[i].uuid) < 0) return 0;
    return access(path, F_OK) == 0;
}

static int gpu_lost(int i) { return gpu_marked(i, "lost"); }
static int gpu_unanswering(int i) { return gpu_marked(i, "unanswering"); }

/* The decimal number in <state dir>/<sub>/<uuid of GPU i>; 0 when the file is missing or holds none. */
static unsigned long long gpu_number(int i, const char *sub) {
    char path[1200], buf[64] = {0};
    if (state_path(path, sizeof path, sub, g.gpus[i].uuid) < 0) return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t r = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (r <= 0) return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(buf, &end, 10);
    if (errno || end == buf || buf[strspn(buf, " \t")] == '-') return 0;
    return v;
}

static long events_size(void) {
    char path[1200];
    struct stat st;
    if (state_path(path, sizeof path, "events", NULL) < 0 || stat(path, &st) < 0) return 0;
    return (long)st.st_size;
}

static int read_compute_mode(int i) {
    char path[1200], buf[64] = {0};
    if (state_path(path, sizeof path, "compute-mode", g.gpus[i].uuid) < 0) return g.gpus[i].compute_mode;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return g.gpus[i].compute_mode;
    ssize_t r = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (r <= 0) return g.gpus[i].compute_mode;
    buf[strcspn(buf, "\r\n")] = '\0';
    int mode = compute_mode_value(buf);
    return mode < 0 ? g.gpus[i].compute_mode : mode;
}

static int write_compute_mode(int i, int mode) {
    char dir[1200], path[1300], tmp[1400];
    if (state_path(dir, sizeof dir, "compute-mode", NULL) < 0) {
        g.gpus[i].compute_mode = mode;
        return 0;
    }
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/%s", dir, g.gpus[i].uuid);
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    char line[64];
    int n = snprintf(line, sizeof line, "%s\n", compute_mode_name(mode));
    int ok = write(fd, line, (size_t)n) == n;
    close(fd);
    /* rename makes the change atomic for readers in other processes */
    if (!ok || rename(tmp, path) < 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- init / shutdown */

static int fail_init_code(void) {
    const char *f = getenv("NVML_SIM_FAIL_INIT");
    if (!f || !*f) return 0;
    if (strcmp(f, "driver_not_loaded") == 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    if (strcmp(f, "lib_rm_version_mismatch") == 0) return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    if (strcmp(f, "no_permission") == 0) return NVML_ERROR_NO_PERMISSION;
    if (strcmp(f, "unknown") == 0) return NVML_ERROR_UNKNOWN;
    int code = atoi(f);
    return code > 0 ? code : NVML_ERROR_UNKNOWN;
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    const char *f = getenv("NVML_SIM_FAIL_INIT");
    if (f && strcmp(f, "hang") == 0) {
        for (;;) pause();
    }
    int code = fail_init_code();
    if (code) return code;
    pthread_mutex_lock(&g.lock);
    nvmlReturn_t ret = NVML_SUCCESS;
    if (g.refcount == 0) {
        const char *profile = getenv("NVML_SIM_PROFILE");
        const char *state = getenv("NVML_SIM_STATE_DIR");
        snprintf(g.state_dir, sizeof g.state_dir, "%s", state ? state : "");
        if (!profile || !*profile || access(profile, F_OK) != 0) {
            ret = NVML_ERROR_DRIVER_NOT_LOADED;
        } else {
            load_err[0] = '\0';
            if (load_profile(profile) < 0) {
                fprintf(stderr, "nvml-sim: %s: %s\n", profile, load_err);
                ret = NVML_ERROR_UNKNOWN;
            } else {
                make_state_dir();
            }
        }
    }
    if (ret == NVML_SUCCESS) g.refcount++;
    pthread_mutex_unlock(&g.lock);
    return ret;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&g.lock);
    nvmlReturn_t ret = g.refcount > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (g.refcount > 0) g.refcount--;
    pthread_mutex_unlock(&g.lock);
    return ret;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 15: return "GPU is lost";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    case 20: return "Insufficient Memory";
    default: return "Unknown Error";
    }
}

/* ---------------------------------------------------------------- helpers for device calls */

static int initialized(void) {
    pthread_mutex_lock(&g.lock);
    int ok = g.refcount > 0;
    pthread_mutex_unlock(&g.lock);
    return ok;
}

static int valid(nvmlDevice_t d) {
    if (!d) return 0;
    uintptr_t p = (uintptr_t)d;
    if (p < (uintptr_t)&g.gpus[0] || p >= (uintptr_t)&g.gpus[MAX_GPUS]) return 0;
    return d->magic == HANDLE_MAGIC && d->gpu >= 0 && d->gpu < g.n && d->mig < g.gpus[d->gpu].n_mig;
}

/* The gate of every call that needs the GPU itself (not only its identity): GPU_IS_LOST for a GPU off the
 * bus (lost/<uuid>), UNKNOWN for one that no longer answers (unanswering/<uuid>); a lost GPU is reported
 * as lost even when it is also marked unanswering. MIG devices share their GPU's gate. */
static nvmlReturn_t gpu_gate(int i) {
    if (gpu_lost(i)) return NVML_ERROR_GPU_IS_LOST;
    if (gpu_unanswering(i)) return NVML_ERROR_UNKNOWN;
    return NVML_SUCCESS;
}

/* Common entry check: initialized, a handle of ours, and (when `needs_gpu`) a GPU still answering. */
static nvmlReturn_t check(nvmlDevice_t d, int needs_gpu) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!valid(d)) return NVML_ERROR_INVALID_ARGUMENT;
    return needs_gpu ? gpu_gate(d->gpu) : NVML_SUCCESS;
}

static nvmlReturn_t copy_str(char *dst, unsigned len, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

#define GPU(d) (&g.gpus[(d)->gpu])
#define MIG(d) (&g.gpus[(d)->gpu].mig[(d)->mig])
#define IS_MIG(d) ((d)->mig >= 0)

/* ---------------------------------------------------------------- system queries */

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    return copy_str(version, length, g.driver);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    char v[96];
    snprintf(v, sizeof v, "%d.%s", g.cuda_version / 1000, g.driver);
    return copy_str(version, length, v);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    *version = g.cuda_version;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) { return nvmlSystemGetCudaDriverVersion(version); }

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned)g.n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

/* ---------------------------------------------------------------- handles */

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= (unsigned)g.n) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g.gpus[index].h;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < g.n; i++) {
        if (strcmp(g.gpus[i].uuid, uuid) == 0) {
            *device = &g.gpus[i].h;
            return NVML_SUCCESS;
        }
        for (int j = 0; j < g.gpus[i].n_mig; j++)
            if (strcmp(g.gpus[i].mig[j].uuid, uuid) == 0) {
                *device = &g.gpus[i].mig[j].h;
                return NVML_SUCCESS;
            }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!bus_id || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < g.n; i++)
        if (strcasecmp(g.gpus[i].bus_id, bus_id) == 0) {
            *device = &g.gpus[i].h;
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

/* ---------------------------------------------------------------- identity: answered even for a lost GPU,
 * so that a health loop can still name the device an XID 79 event came from. */

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
    nvmlReturn_t r = check(d, 0);
    if (r) return r;
    return copy_str(uuid, length, IS_MIG(d) ? MIG(d)->uuid : GPU(d)->uuid);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index) {
    nvmlReturn_t r = check(d, 0);
    if (r) return r;
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)(IS_MIG(d) ? d->mig : d->gpu);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
    nvmlReturn_t r = check(d, 0);
    if (r) return r;
    if (!IS_MIG(d)) return copy_str(name, length, GPU(d)->name);
    char full[160];
    snprintf(full, sizeof full, "%s MIG %s", GPU(d)->name, MIG(d)->profile);
    return copy_str(name, length, full);
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *minor) {
    nvmlReturn_t r = check(d, 0);
    if (r) return r;
    if (!minor) return NVML_ERROR_INVALID_ARGUMENT;
    *minor = GPU(d)->minor;
    return NVML_SUCCESS;
}

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

static void fill_pci(nvmlPciInfo_t *pci, const char *bus_id) {
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", bus_id + (strlen(bus_id) > 12 ? 4 : 0));
    sscanf(bus_id, "%x:%x:%x", &pci->domain, &pci->bus, &pci->device);
    pci->pciDeviceId = 0x10de0000u; /* NVIDIA's vendor id in the low half is what tools check */
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    nvmlReturn_t r = check(d, 0);
    if (r) return r;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    fill_pci(pci, GPU(d)->bus_id);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *pci) { return nvmlDeviceGetPciInfo_v3(d, pci); }
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t d, nvmlPciInfo_t *pci) { return nvmlDeviceGetPciInfo_v3(d, pci); }

/* ---------------------------------------------------------------- properties */

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

static unsigned long long mem_of(nvmlDevice_t d) { return IS_MIG(d) ? MIG(d)->mem : GPU(d)->mem; }

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    m->total = m->free = mem_of(d);
    m->used = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    m->total = m->free = mem_of(d);
    m->reserved = m->used = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (!major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    *major = GPU(d)->cc_major;
    *minor = GPU(d)->cc_minor;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t d, unsigned int *node) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (!node) return NVML_ERROR_INVALID_ARGUMENT;
    if (GPU(d)->numa < 0) return NVML_ERROR_NOT_SUPPORTED;
    *node = (unsigned)GPU(d)->numa;
    return NVML_SUCCESS;
}

/* nvmlGpuFabricInfo_t: NVLink fabric (NVSwitch / GB200 NVL) registration of a GPU. */
typedef struct {
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned int state;
} sim_fabric_info;

EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t d, sim_fabric_info *info) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    if (IS_MIG(d) || !GPU(d)->fabric_state) return NVML_ERROR_NOT_SUPPORTED;
    memcpy(info->clusterUuid, GPU(d)->cluster_uuid, 16);
    info->status = NVML_SUCCESS;
    info->cliqueId = GPU(d)->clique_id;
    info->state = (unsigned)GPU(d)->fabric_state;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t d, int *brand) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (!brand) return NVML_ERROR_INVALID_ARGUMENT;
    *brand = GPU(d)->brand;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t d, unsigned int *arch) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (!arch) return NVML_ERROR_INVALID_ARGUMENT;
    *arch = GPU(d)->arch;
    return NVML_SUCCESS;
}

/* nvmlDeviceAddressingMode_v1_t: the caller sets the version, NVML fills in the mode. */
typedef struct {
    unsigned version;
    unsigned value;
} sim_addressing_mode;
#define ADDRESSING_MODE_V1 0x1000008u
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25

/* The profile's mode (GH200, GB200: ATS); GPUs without one and MIG handles: NOT_SUPPORTED. */
EXPORT nvmlReturn_t nvmlDeviceGetAddressingMode(nvmlDevice_t d, sim_addressing_mode *mode) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (!mode) return NVML_ERROR_INVALID_ARGUMENT;
    if (mode->version != ADDRESSING_MODE_V1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (IS_MIG(d) || !GPU(d)->addressing) return NVML_ERROR_NOT_SUPPORTED;
    mode->value = (unsigned)(GPU(d)->addressing - 1);
    return NVML_SUCCESS;
}

/* ---------------------------------------------------------------- MIG */

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    if (IS_MIG(d) || !GPU(d)->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    *current = (unsigned)GPU(d)->mig_enabled;
    *pending = (unsigned)GPU(d)->mig_pending;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (IS_MIG(d) || !GPU(d)->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    *count = MAX_MIG;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *mig) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (!mig || IS_MIG(d)) return NVML_ERROR_INVALID_ARGUMENT;
    if (!GPU(d)->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    if (index >= MAX_MIG) return NVML_ERROR_INVALID_ARGUMENT;
    if (!GPU(d)->mig_enabled || index >= (unsigned)GPU(d)->n_mig) return NVML_ERROR_NOT_FOUND;
    *mig = &GPU(d)->mig[index].h;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t d, nvmlDevice_t *parent) {
    nvmlReturn_t r = check(d, 0);
    if (r) return r;
    if (!parent || !IS_MIG(d)) return NVML_ERROR_INVALID_ARGUMENT;
    *parent = &GPU(d)->h;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is_mig) {
    nvmlReturn_t r = check(d, 0);
    if (r) return r;
    if (!is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *is_mig = IS_MIG(d) ? 1u : 0u;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (!id) return NVML_ERROR_INVALID_ARGUMENT;
    if (!IS_MIG(d)) return NVML_ERROR_NOT_SUPPORTED;
    *id = MIG(d)->gi;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (!id) return NVML_ERROR_INVALID_ARGUMENT;
    if (!IS_MIG(d)) return NVML_ERROR_NOT_SUPPORTED;
    *id = MIG(d)->ci;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t d, unsigned int id, nvmlGpuInstance_t *gi) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (!gi || IS_MIG(d)) return NVML_ERROR_INVALID_ARGUMENT;
    if (!GPU(d)->mig_capable || !GPU(d)->mig_enabled) return NVML_ERROR_NOT_SUPPORTED;
    for (int j = 0; j < GPU(d)->n_mig; j++) {
        sim_mig *m = &GPU(d)->mig[j];
        if (m->gi != id) continue;
        if (m->gi_profile_id < 0) return NVML_ERROR_NOT_SUPPORTED; /* a size without a known profile */
        *gi = &m->gi_handle;
        return NVML_SUCCESS;
    }
    return NVML_ERROR_NOT_FOUND;
}

typedef struct {
    unsigned int start, size;
} nvmlGpuInstancePlacement_t;

typedef struct {
    nvmlDevice_t device;
    unsigned int id, profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gi, nvmlGpuInstanceInfo_t *info) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!gi || !info || gi->magic != GI_MAGIC || gi->gpu < 0 || gi->gpu >= g.n || gi->mig < 0 ||
        gi->mig >= g.gpus[gi->gpu].n_mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = gpu_gate(gi->gpu);
    if (r) return r;
    const sim_mig *m = &g.gpus[gi->gpu].mig[gi->mig];
    info->device = &g.gpus[gi->gpu].h;
    info->id = m->gi;
    info->profileId = (unsigned)m->gi_profile_id;
    info->placement.start = (unsigned)m->placement_start;
    info->placement.size = (unsigned)m->placement_size;
    return NVML_SUCCESS;
}

typedef struct {
    unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount,
        sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount, computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t d, nvmlDeviceAttributes_t *a) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (!a) return NVML_ERROR_INVALID_ARGUMENT;
    memset(a, 0, sizeof *a);
    unsigned slices = 7;
    if (IS_MIG(d)) sscanf(MIG(d)->profile, "%ug", &slices);
    a->gpuInstanceSliceCount = a->computeInstanceSliceCount = slices;
    a->multiprocessorCount = slices * 16;
    a->memorySizeMB = mem_of(d) / (1024ULL * 1024ULL);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t d, nvmlDeviceAttributes_t *a) { return nvmlDeviceGetAttributes_v2(d, a); }

/* ---------------------------------------------------------------- topology */

EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, int *level) {
    nvmlReturn_t r = check(a, 1);
    if (r || (r = check(b, 1))) return r;
    if (!level) return NVML_ERROR_INVALID_ARGUMENT;
    *level = g.pcie[a->gpu][b->gpu];
    return NVML_SUCCESS;
}

static nvmlReturn_t check_link(nvmlDevice_t d, unsigned link) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (IS_MIG(d)) return NVML_ERROR_NOT_SUPPORTED;
    if (GPU(d)->n_links == 0) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, int *active) {
    nvmlReturn_t r = check_link(d, link);
    if (r) return r;
    if (!active) return NVML_ERROR_INVALID_ARGUMENT;
    *active = link < (unsigned)GPU(d)->n_links;
    return NVML_SUCCESS;
}

static void switch_bus_id(char *dst, size_t len, unsigned link) {
    /* six NVSwitches, links spread across them as on HGX boards */
    snprintf(dst, len, "00000000:%02X:00.0", 0xC1 + (link % 6));
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned int link, nvmlPciInfo_t *pci) {
    nvmlReturn_t r = check_link(d, link);
    if (r) return r;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    if (link >= (unsigned)GPU(d)->n_links) return NVML_ERROR_NOT_SUPPORTED;
    int remote = GPU(d)->link_remote[link];
    if (remote >= 0) {
        fill_pci(pci, g.gpus[remote].bus_id);
    } else {
        char bus[32];
        switch_bus_id(bus, sizeof bus, link);
        fill_pci(pci, bus);
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t d, unsigned int link, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetNvLinkRemotePciInfo_v2(d, link, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t d, unsigned int link, int *type) {
    nvmlReturn_t r = check_link(d, link);
    if (r) return r;
    if (!type) return NVML_ERROR_INVALID_ARGUMENT;
    if (link >= (unsigned)GPU(d)->n_links) return NVML_ERROR_NOT_SUPPORTED;
    *type = GPU(d)->link_remote[link] >= 0 ? 0 : 2; /* NVML_NVLINK_DEVICE_TYPE_GPU / _SWITCH */
    return NVML_SUCCESS;
}

/* ---------------------------------------------------------------- compute mode */

EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t d, int *mode) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (!mode) return NVML_ERROR_INVALID_ARGUMENT;
    if (IS_MIG(d)) return NVML_ERROR_NOT_SUPPORTED;
    *mode = read_compute_mode(d->gpu);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t d, int mode) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (IS_MIG(d)) return NVML_ERROR_NOT_SUPPORTED;
    if (mode < 0 || mode > 3) return NVML_ERROR_INVALID_ARGUMENT;
    if (mode == 1) return NVML_ERROR_NOT_SUPPORTED; /* EXCLUSIVE_THREAD was removed from NVML */
    return write_compute_mode(d->gpu, mode) == 0 ? NVML_SUCCESS : NVML_ERROR_NO_PERMISSION;
}

/* ---------------------------------------------------------------- memory health and recovery
 *
 * What a health check reads after a fault, each from the state directory at every call (sim/nvml/README.md):
 * retired-pages/remap pending flags, uncorrected ECC counts and the driver's recommended recovery action.
 * Support follows the architecture as on real GPUs: dynamic page retirement up to Turing, row remapping
 * from Ampere on (an unknown architecture has neither); ECC counters on every GPU (the profiles describe
 * data-centre GPUs with ECC on). MIG handles answer NOT_SUPPORTED: these are facts of the whole GPU, to be
 * read on the parent, as with event registration. */

#define ARCH_KEPLER 2u
#define ARCH_TURING 6u
#define ARCH_AMPERE 7u

static int retires_pages(const sim_gpu *gp) { return gp->arch >= ARCH_KEPLER && gp->arch <= ARCH_TURING; }
static int remaps_rows(const sim_gpu *gp) { return gp->arch != ARCH_UNKNOWN && gp->arch >= ARCH_AMPERE; }

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t d, int *is_pending) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (!is_pending) return NVML_ERROR_INVALID_ARGUMENT;
    if (IS_MIG(d) || !retires_pages(GPU(d))) return NVML_ERROR_NOT_SUPPORTED;
    *is_pending = gpu_marked(d->gpu, "retired-pending") ? 1 : 0; /* NVML_FEATURE_ENABLED / _DISABLED */
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned int *corr_rows, unsigned int *unc_rows,
                                              unsigned int *is_pending, unsigned int *failure_occurred) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (!corr_rows || !unc_rows || !is_pending || !failure_occurred) return NVML_ERROR_INVALID_ARGUMENT;
    if (IS_MIG(d) || !remaps_rows(GPU(d))) return NVML_ERROR_NOT_SUPPORTED;
    *corr_rows = 0;
    *unc_rows = 0;
    *is_pending = gpu_marked(d->gpu, "remap-pending") ? 1u : 0u;
    *failure_occurred = gpu_marked(d->gpu, "remap-failed") ? 1u : 0u;
    return NVML_SUCCESS;
}

enum { NVML_MEMORY_ERROR_TYPE_CORRECTED = 0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1 };
enum { NVML_VOLATILE_ECC = 0, NVML_AGGREGATE_ECC = 1 };

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, unsigned int error_type, unsigned int counter_type,
                                                unsigned long long *count) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (!count || error_type > NVML_MEMORY_ERROR_TYPE_UNCORRECTED || counter_type > NVML_AGGREGATE_ECC)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (IS_MIG(d)) return NVML_ERROR_NOT_SUPPORTED;
    if (error_type == NVML_MEMORY_ERROR_TYPE_CORRECTED) {
        *count = 0; /* corrected errors need no action; the stand-in has none */
        return NVML_SUCCESS;
    }
    *count = gpu_number(d->gpu, counter_type == NVML_VOLATILE_ECC ? "ecc-volatile" : "ecc-aggregate");
    return NVML_SUCCESS;
}

/* nvmlValue_t and nvmlFieldValue_t as in nvml.h (pynvml's c_nvmlValue_t / c_nvmlFieldValue_t). */
typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    signed int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;   /* CPU time of the reading, microseconds since 1970 */
    long long latencyUsec; /* how long the reading took; 0 for a cached value */
    int valueType;         /* nvmlValueType_t */
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

_Static_assert(sizeof(nvmlValue_t) == 8, "nvmlValue_t is 8 bytes");
_Static_assert(offsetof(nvmlFieldValue_t, timestamp) == 8, "nvmlFieldValue_t.timestamp");
_Static_assert(offsetof(nvmlFieldValue_t, valueType) == 24, "nvmlFieldValue_t.valueType");
_Static_assert(offsetof(nvmlFieldValue_t, nvmlReturn) == 28, "nvmlFieldValue_t.nvmlReturn");
_Static_assert(offsetof(nvmlFieldValue_t, value) == 32, "nvmlFieldValue_t.value");
_Static_assert(sizeof(nvmlFieldValue_t) == 40, "nvmlFieldValue_t is 40 bytes");

#define NVML_FI_DEV_GET_GPU_RECOVERY_ACTION 230u
#define NVML_VALUE_TYPE_UNSIGNED_INT 1

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t d, int count, nvmlFieldValue_t *values) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (count < 0 || (count > 0 && !values)) return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long now_us = (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
    for (int k = 0; k < count; k++) {
        nvmlFieldValue_t *v = &values[k];
        v->timestamp = now_us;
        v->latencyUsec = 0;
        memset(&v->value, 0, sizeof v->value);
        if (v->fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION && !IS_MIG(d)) {
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            v->value.uiVal = (unsigned)gpu_number(d->gpu, "recovery-action");
            v->nvmlReturn = NVML_SUCCESS;
        } else {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return NVML_SUCCESS;
}

/* ---------------------------------------------------------------- events */

typedef struct sim_event_set {
    unsigned magic;
    pthread_mutex_t lock;
    long offset; /* next unread byte of the events file */
    unsigned long long mask[MAX_GPUS];
    int inotify_fd;
} sim_event_set;
typedef sim_event_set *nvmlEventSet_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    sim_event_set *s = calloc(1, sizeof *s);
    if (!s) return NVML_ERROR_MEMORY;
    s->magic = EVSET_MAGIC;
    pthread_mutex_init(&s->lock, NULL);
    /* Like NVML, a set sees only the events that happen after it is created. */
    s->offset = events_size();
    s->inotify_fd = -1;
    if (g.state_dir[0]) {
        s->inotify_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
        if (s->inotify_fd >= 0 &&
            inotify_add_watch(s->inotify_fd, g.state_dir, IN_MODIFY | IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE) < 0) {
            close(s->inotify_fd);
            s->inotify_fd = -1;
        }
    }
    *set = s;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!set || set->magic != EVSET_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    set->magic = 0;
    if (set->inotify_fd >= 0) close(set->inotify_fd);
    pthread_mutex_destroy(&set->lock);
    free(set);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (!types) return NVML_ERROR_INVALID_ARGUMENT;
    if (IS_MIG(d) || !GPU(d)->events_supported) return NVML_ERROR_NOT_SUPPORTED;
    *types = EV_SUPPORTED;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (!set || set->magic != EVSET_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    if (IS_MIG(d) || !GPU(d)->events_supported) return NVML_ERROR_NOT_SUPPORTED;
    if (types & ~EV_SUPPORTED) return NVML_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&set->lock);
    set->mask[d->gpu] |= types;
    pthread_mutex_unlock(&set->lock);
    return NVML_SUCCESS;
}

/* Looks for the next registered event after set->offset; 1 when `data` was filled. */
static int next_event(sim_event_set *s, nvmlEventData_t *data) {
    char path[1200];
    if (state_path(path, sizeof path, "events", NULL) < 0) return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    int found = 0;
    pthread_mutex_lock(&s->lock);
    if (lseek(fd, s->offset, SEEK_SET) == s->offset) {
        char *text = read_all(fd);
        char *line = text;
        while (text && !found) {
            char *nl = strchr(line, '\n');
            if (!nl) break; /* a line still being written */
            *nl = '\0';
            s->offset += (long)(nl - line) + 1;
            char uuid[96];
            unsigned long long xid;
            if (sscanf(line, "%95s %llu", uuid, &xid) == 2) {
                for (int i = 0; i < g.n && !found; i++) {
                    int mig = -1;
                    if (strcmp(g.gpus[i].uuid, uuid) != 0) {
                        for (int j = 0; j < g.gpus[i].n_mig; j++)
                            if (strcmp(g.gpus[i].mig[j].uuid, uuid) == 0) mig = j;
                        if (mig < 0) continue;
                    }
                    if (!(s->mask[i] & EV_XID)) break;
                    data->device = &g.gpus[i].h;
                    data->eventType = EV_XID;
                    data->eventData = xid;
                    data->gpuInstanceId = mig >= 0 ? g.gpus[i].mig[mig].gi : NO_ID;
                    data->computeInstanceId = mig >= 0 ? g.gpus[i].mig[mig].ci : NO_ID;
                    found = 1;
                }
            }
            line = nl + 1;
        }
        free(text);
    }
    pthread_mutex_unlock(&s->lock);
    close(fd);
    return found;
}

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!set || set->magic != EVSET_MAGIC || !data) return NVML_ERROR_INVALID_ARGUMENT;
    long long deadline = now_ms() + timeout_ms;
    for (;;) {
        if (next_event(set, data)) return NVML_SUCCESS;
        long long left = deadline - now_ms();
        if (left <= 0) return NVML_ERROR_TIMEOUT;
        if (set->inotify_fd < 0) {
            /* no state dir: nothing can ever arrive, so just sleep out the timeout */
            poll(NULL, 0, (int)left);
            continue;
        }
        struct pollfd pfd = {set->inotify_fd, POLLIN, 0};
        if (poll(&pfd, 1, (int)left) > 0) {
            char buf[4096];
            while (read(set->inotify_fd, buf, sizeof buf) > 0) {
            }
        }
    }
}

EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    return nvmlEventSetWait_v2(set, data, timeout_ms);
}
