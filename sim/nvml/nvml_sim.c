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
 *                       recovery-action/), the append-only `events` file ("<uuid> <xid>" per line), MIG
 *                       layouts mig/<uuid> (under the flock of mig/.lock), MIG modes mig-mode/<uuid>, the
 *                       running processes processes/<uuid> (JSON), and the fault points fault/kill-after,
 *                       fault/fail-after.
 *   NVML_SIM_FAIL_INIT  make nvmlInit fail: driver_not_loaded, lib_rm_version_mismatch, no_permission,
 *                       unknown, or a numeric NVML return code; `hang`: nvmlInit never returns (a hung driver).
 *   NVML_SIM_KILL_AFTER N: the process kills itself (SIGKILL) right after its N-th successful call that
 *                       changes a GPU's state (fault points below; also fault/kill-after, fault/fail-after
 *                       in the state dir).
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
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
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
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
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

/* MIG layout of a GPU: its GPU instances (GIs) and their compute instances (CIs), each CI one MIG device.
 * This is what the state file mig/<gpu-uuid> holds (sim/nvml/README.md); the profile's static mig_devices
 * are the layout while there is none. Plain data, zero-filled before use, so layouts compare with memcmp. */
#define MAX_GI 8
#define PROFILE_COUNT 17    /* profile indices driver 580 knows: INVALID_ARGUMENT from 17 on */
#define CI_PROFILE_COUNT 9  /* NVML_COMPUTE_INSTANCE_PROFILE_COUNT */
#define COMPUTE_SLICES 7
#define MEMORY_SLICES 8
#define MAX_PLACEMENTS 8

typedef struct {
    unsigned long long mem_mib;
    unsigned id, serial, slices; /* serial: the layout counter when made (0: the profile's) */
    int profile_index, profile_id; /* -1: not known (a static GI of a size without a profile) */
    int start, size;               /* placement, in memory slices */
    char name[36];                 /* GI profile name, "3g.40gb" */
} lay_gi;

typedef struct {
    unsigned long long mem_mib;
    unsigned gi, ci, start, slices; /* start, slices: compute slices within the GI */
    int profile_id;                 /* NVML_COMPUTE_INSTANCE_PROFILE_* */
    char uuid[96];
    char profile[44];               /* the MIG device's profile, "3g.40gb" or "1c.3g.40gb" */
} lay_ci;

typedef struct {
    unsigned counter; /* raised by every creation; part of each new MIG device's UUID */
    int n_gi, n_ci, pad;
    lay_gi gi[MAX_GI];
    lay_ci ci[MAX_MIG]; /* in enumeration order (nvmlDeviceGetMigDeviceHandleByIndex) */
} sim_layout;

/* A GPU-instance profile the GPU supports (the profile's mig_profiles), by NVML profile index. */
typedef struct {
    int present;
    char name[36];
    unsigned id, slices, instances, sms, ce, dec, enc, jpeg, ofa;
    unsigned long long mem_mib;
    int n_place;
    unsigned place_start[MAX_PLACEMENTS], place_size[MAX_PLACEMENTS];
} sim_profile;

/* Handles point into slots, so a handle stays valid while its instance lives; a slot is reused only
 * after every other free slot (oldest-freed first), so a stale handle rarely names a new instance. */
#define MAX_SLOTS 32

/* nvmlGpuInstance_t */
typedef struct sim_gi {
    unsigned magic;
    int gpu, slot;
} sim_gi;
typedef sim_gi *nvmlGpuInstance_t;

/* nvmlComputeInstance_t */
typedef struct sim_ci {
    unsigned magic;
    int gpu, slot;
} sim_ci;
typedef sim_ci *nvmlComputeInstance_t;

typedef struct {
    sim_gi handle;
    int live;
    unsigned long long freed;
    lay_gi gi;
} gi_slot;

typedef struct {
    sim_handle h;      /* h.mig is the slot */
    sim_ci ci_handle;
    int live;
    unsigned long long freed;
    int index;         /* enumeration index under the GPU */
    int gi_slot;
    lay_ci c;
    char uuid[96];
    char profile[44];
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
    int n_mig;            /* live MIG devices; order[] maps enumeration index to slot */
    int order[MAX_MIG];
    sim_mig mig[MAX_SLOTS];
    gi_slot gis[MAX_SLOTS];
    sim_profile prof[PROFILE_COUNT];
    sim_layout static_layout; /* the profile's mig_devices */
    sim_layout local_layout;  /* without a state dir: this process's layout once changed */
    int has_local;
    sim_layout applied;       /* what the slots show */
    int applied_valid;
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
#define CI_MAGIC 0x43494e53u
#define EVSET_MAGIC 0x45565354u

/* Serialises MIG layout changes and their application to the slots within the process (recursive: a
 * change applies the new layout through the same path a read does). */
static pthread_mutex_t mig_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static unsigned long long free_clock;

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

static const jvalue *num_item(const jvalue *arr, size_t k) {
    return arr && arr->type == J_ARR && k < arr->len && arr->items[k].type == J_NUM ? &arr->items[k] : NULL;
}

/* The GPU-instance profiles of mig_profiles, by profile index (validated in full by load_profile). */
static int load_mig_profiles(const jvalue *jg, sim_gpu *gp, int i) {
    const jvalue *list = json_get(jg, "mig_profiles");
    if (!list || list->type != J_ARR) return 0;
    static const char *keys[] = {"gi_profile_id", "slices", "instances", "multiprocessors", "copy_engines",
                                 "decoders", "encoders", "jpeg_engines", "ofa_engines"};
    for (size_t k = 0; k < list->len; k++) {
        const jvalue *jp = &list->items[k];
        double d, v[9];
        if (get_num(jp, "profile_index", &d, 1, "mig_profiles", (int)k) < 0) return -1;
        if (d < 0 || d >= PROFILE_COUNT) return perr("gpus[%d].mig_profiles[%d].profile_index: 0..16", i, (int)k);
        sim_profile *p = &gp->prof[(int)d];
        memset(p, 0, sizeof *p);
        if (get_str(jp, "name", p->name, sizeof p->name, "mig_profiles", (int)k) < 0) return -1;
        for (int f = 0; f < 9; f++)
            if (get_num(jp, keys[f], &v[f], 1, "mig_profiles", (int)k) < 0) return -1;
        if (get_num(jp, "memory_mib", &d, 1, "mig_profiles", (int)k) < 0) return -1;
        p->mem_mib = (unsigned long long)d;
        p->id = (unsigned)v[0], p->slices = (unsigned)v[1], p->instances = (unsigned)v[2], p->sms = (unsigned)v[3];
        p->ce = (unsigned)v[4], p->dec = (unsigned)v[5], p->enc = (unsigned)v[6], p->jpeg = (unsigned)v[7];
        p->ofa = (unsigned)v[8];
        const jvalue *pl = json_get(jp, "placements");
        for (size_t q = 0; pl && pl->type == J_ARR && q < pl->len; q++) {
            const jvalue *a = num_item(&pl->items[q], 0), *b = num_item(&pl->items[q], 1);
            if (!a || !b || p->n_place >= MAX_PLACEMENTS)
                return perr("gpus[%d].mig_profiles[%d].placements: [start, size] pairs, at most 8", i, (int)k);
            p->place_start[p->n_place] = (unsigned)a->num;
            p->place_size[p->n_place++] = (unsigned)b->num;
        }
        p->present = 1;
    }
    return 0;
}

static const sim_profile *profile_by_id(const sim_gpu *gp, int id) {
    for (int k = 0; k < PROFILE_COUNT; k++)
        if (gp->prof[k].present && (int)gp->prof[k].id == id) return &gp->prof[k];
    return NULL;
}

/* NVML_COMPUTE_INSTANCE_PROFILE_* by compute slices (1, 2, 3, 4, 7); -1 for other sizes. */
static int ci_profile_of_slices(unsigned slices) {
    switch (slices) {
    case 1: return 0;
    case 2: return 1;
    case 3: return 2;
    case 4: return 3;
    case 7: return 4;
    default: return -1;
    }
}

/* The profile's mig_devices as a layout: one GI per gi_id (first device's facts), one CI per device. */
static void build_static_layout(sim_gpu *gp) {
    sim_layout *l = &gp->static_layout;
    memset(l, 0, sizeof *l);
    for (int j = 0; j < gp->n_mig && j < MAX_MIG; j++) {
        const sim_mig *m = &gp->mig[j];
        unsigned c = 0, gslices = 0, gb = 0;
        int n = 0, suffix = 0;
        const char *gi_name = m->profile;
        if (sscanf(m->profile, "%uc.%n", &c, &n) == 1 && n > 0) gi_name = m->profile + n;
        parse_mig_profile(gi_name, &gslices, &gb, &suffix);
        int k;
        for (k = 0; k < l->n_gi && l->gi[k].id != m->gi; k++) {
        }
        if (k == l->n_gi && l->n_gi < MAX_GI) {
            lay_gi *gi = &l->gi[l->n_gi++];
            const sim_profile *p = profile_by_id(gp, m->gi_profile_id);
            gi->id = m->gi;
            gi->profile_id = m->gi_profile_id;
            gi->profile_index = p ? (int)(p - gp->prof) : -1;
            gi->start = m->placement_start;
            gi->size = m->placement_size;
            gi->slices = p ? p->slices : gslices;
            gi->mem_mib = m->mem / (1024ULL * 1024ULL);
            snprintf(gi->name, sizeof gi->name, "%s", gi_name);
        }
        lay_ci *ci = &l->ci[l->n_ci++];
        unsigned start = 0;
        for (int q = 0; q < l->n_ci - 1; q++)
            if (l->ci[q].gi == m->gi) start += l->ci[q].slices;
        ci->gi = m->gi;
        ci->ci = m->ci;
        ci->slices = c ? c : gslices;
        ci->start = start;
        ci->profile_id = ci_profile_of_slices(ci->slices);
        ci->mem_mib = m->mem / (1024ULL * 1024ULL);
        snprintf(ci->uuid, sizeof ci->uuid, "%s", m->uuid);
        snprintf(ci->profile, sizeof ci->profile, "%s", m->profile);
    }
    memset(gp->mig, 0, sizeof gp->mig);
    gp->n_mig = 0;
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
    if (load_mig_profiles(jg, gp, i) < 0) return -1;
    build_static_layout(gp);
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

/* ---------------------------------------------------------------- fault points
 *
 * For crash tests, the calls that change a GPU's state (nvmlDeviceCreateGpuInstance(WithPlacement),
 * nvmlGpuInstanceCreateComputeInstance, nvmlComputeInstanceDestroy, nvmlGpuInstanceDestroy,
 * nvmlDeviceSetMigMode, nvmlDeviceSetComputeMode) are counted per process (sim/nvml/README.md):
 *   fault/kill-after  "N [PID]"       SIGKILL right after the N-th of them that returned NVML_SUCCESS, once
 *                                    its state file is renamed into place;
 *   fault/fail-after  "N CODE [PID]"  the N-th of them that is called (whatever it would have answered)
 *                                    returns CODE at once and changes nothing; the calls after it run;
 *   NVML_SIM_KILL_AFTER=N             as kill-after, for this process and the ones it starts.
 * Each is read at every such call. A process counts from the first call that sees the current arming (the
 * file's inode, mtime and text; the variable's text), so a file written anew (renamed into place) re-arms
 * it, for processes started before too; a forked child counts afresh. With a PID only that process counts;
 * without one every process of the node counts on its own. */

typedef struct {
    pid_t pid;                /* the process that counted: a forked child starts afresh */
    char key[192];            /* the arming counted against; empty: none seen */
    unsigned long long count;
} fault_counter;

static pthread_mutex_t fault_lock = PTHREAD_MUTEX_INITIALIZER;
static fault_counter kill_file_counter, kill_env_counter, fail_file_counter;

/* Counts one call against `c` if `key` (the arming now) is the one it counted against, else starts anew
 * at 1; returns the call's number. Caller holds fault_lock. */
static unsigned long long fault_count(fault_counter *c, const char *key) {
    pid_t self = getpid();
    if (c->pid != self || strcmp(c->key, key) != 0) {
        c->pid = self;
        snprintf(c->key, sizeof c->key, "%s", key);
        c->count = 0;
    }
    return ++c->count;
}

/* The text of fault/<name> and a key naming this arming of it; -1 without the file (or a state dir). */
static int fault_file(const char *name, char *text, size_t len, char *key, size_t key_len) {
    char path[1200];
    struct stat st;
    if (state_path(path, sizeof path, "fault", name) < 0) return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t r = fstat(fd, &st) == 0 ? read(fd, text, len - 1) : -1;
    close(fd);
    if (r < 0) return -1;
    text[r] = '\0';
    snprintf(key, key_len, "%llu %llu %lld.%09ld %s", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino,
             (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec, text);
    return 0;
}

static void fault_note(const char *fmt, ...) {
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n > 0) {
        ssize_t w = write(STDERR_FILENO, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
        (void)w;
    }
}

/* At the start of a changing call: NVML_SUCCESS to go on, or the code fault/fail-after makes it return. */
static nvmlReturn_t fault_before(const char *call) {
    char text[64], key[192];
    if (fault_file("fail-after", text, sizeof text, key, sizeof key) < 0) return NVML_SUCCESS;
    unsigned long long n = 0;
    int code = 0, pid = 0;
    int fields = sscanf(text, "%llu %d %d", &n, &code, &pid);
    if (fields < 2 || n == 0 || code <= 0 || (fields == 3 && pid != (int)getpid())) return NVML_SUCCESS;
    pthread_mutex_lock(&fault_lock);
    int hit = fault_count(&fail_file_counter, key) == n;
    pthread_mutex_unlock(&fault_lock);
    if (!hit) return NVML_SUCCESS;
    fault_note("nvml-sim: fault/fail-after: call %llu (%s) of process %d returns %d\n", n, call, (int)getpid(),
               code);
    return (nvmlReturn_t)code;
}

static void fault_kill(const char *why, unsigned long long n, const char *call) {
    fault_note("nvml-sim: %s: killing process %d after call %llu (%s)\n", why, (int)getpid(), n, call);
    kill(getpid(), SIGKILL);
    for (;;) pause();
}

/* At the end of a changing call that answered `r`: a success counts, and may be the one to die after. */
static nvmlReturn_t fault_after(const char *call, nvmlReturn_t r) {
    if (r != NVML_SUCCESS) return r;
    char text[64], key[192];
    unsigned long long n = 0;
    int pid = 0;
    if (fault_file("kill-after", text, sizeof text, key, sizeof key) == 0) {
        int fields = sscanf(text, "%llu %d", &n, &pid);
        if (fields >= 1 && n > 0 && (fields == 1 || pid == (int)getpid())) {
            pthread_mutex_lock(&fault_lock);
            if (fault_count(&kill_file_counter, key) == n) fault_kill("fault/kill-after", n, call);
            pthread_mutex_unlock(&fault_lock);
        }
    }
    const char *env = getenv("NVML_SIM_KILL_AFTER");
    if (env && sscanf(env, "%llu", &n) == 1 && n > 0) {
        snprintf(key, sizeof key, "%s", env);
        pthread_mutex_lock(&fault_lock);
        if (fault_count(&kill_env_counter, key) == n) fault_kill("NVML_SIM_KILL_AFTER", n, call);
        pthread_mutex_unlock(&fault_lock);
    }
    return r;
}

/* The body of an exported changing call: `body` runs unless fault/fail-after stops it, then counts. */
#define FAULT_POINT(body)                                       \
    do {                                                        \
        nvmlReturn_t fault_ = fault_before(__func__);           \
        return fault_ ? fault_ : fault_after(__func__, (body)); \
    } while (0)

/* ---------------------------------------------------------------- MIG layout state
 *
 * mig/<gpu-uuid> holds a GPU's layout once anything changed it (sim/nvml/README.md): written whole to a
 * temporary file renamed into place, under an flock of mig/.lock, read at each call, so every process of
 * the node sees a change at once. Without the file the profile's mig_devices are the layout (while MIG
 * mode is on); without a state dir each process keeps its own. mig-mode/<gpu-uuid> ("1" or "0"), written
 * by the stand-in's set_mig_mode, overrides the profile's MIG mode. */

#define LAYOUT_HEADER "nvml-sim mig layout 1"

/* "1"/"0" from mig-mode/<uuid>; -1 without the file. */
static int mig_mode_file(int i) {
    char path[1200], buf[8] = {0};
    if (state_path(path, sizeof path, "mig-mode", g.gpus[i].uuid) < 0) return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t r = read(fd, buf, sizeof buf - 1);
    close(fd);
    return r > 0 ? buf[0] == '1' : -1;
}

static int mig_on(int i) {
    int f = mig_mode_file(i);
    return f >= 0 ? f : g.gpus[i].mig_enabled;
}

static int parse_layout(char *text, sim_layout *l) {
    memset(l, 0, sizeof *l);
    char *save = NULL;
    char *line = strtok_r(text, "\n", &save);
    if (!line || strcmp(line, LAYOUT_HEADER) != 0) return -1;
    while ((line = strtok_r(NULL, "\n", &save))) {
        if (sscanf(line, "counter %u", &l->counter) == 1) continue;
        if (strncmp(line, "gi ", 3) == 0 && l->n_gi < MAX_GI) {
            lay_gi *gi = &l->gi[l->n_gi];
            if (sscanf(line, "gi %u %d %d %d %d %u %llu %u %35s", &gi->id, &gi->profile_index, &gi->profile_id,
                       &gi->start, &gi->size, &gi->slices, &gi->mem_mib, &gi->serial, gi->name) != 9)
                return -1;
            l->n_gi++;
        } else if (strncmp(line, "ci ", 3) == 0 && l->n_ci < MAX_MIG) {
            lay_ci *ci = &l->ci[l->n_ci];
            if (sscanf(line, "ci %u %u %d %u %u %llu %95s %43s", &ci->gi, &ci->ci, &ci->profile_id, &ci->start,
                       &ci->slices, &ci->mem_mib, ci->uuid, ci->profile) != 8)
                return -1;
            l->n_ci++;
        }
    }
    return 0;
}

/* The layout GPU i has now: the state file, this process's own, or the profile's. */
static void current_layout(int i, sim_layout *l) {
    sim_gpu *gp = &g.gpus[i];
    char path[1200];
    if (state_path(path, sizeof path, "mig", gp->uuid) == 0) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            char *text = read_all(fd);
            close(fd);
            int ok = text && parse_layout(text, l) == 0;
            free(text);
            if (ok) return;
            fprintf(stderr, "nvml-sim: %s: not a MIG layout; using the profile's\n", path);
        }
    } else if (gp->has_local) {
        memcpy(l, &gp->local_layout, sizeof *l);
        return;
    }
    memset(l, 0, sizeof *l);
    if (mig_on(i) && gp->mig_enabled) memcpy(l, &gp->static_layout, sizeof *l);
}

static int write_layout(int i, const sim_layout *l) {
    sim_gpu *gp = &g.gpus[i];
    char dir[1200], path[1300], tmp[1400];
    if (state_path(dir, sizeof dir, "mig", NULL) < 0) {
        memcpy(&gp->local_layout, l, sizeof *l);
        gp->has_local = 1;
        return 0;
    }
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/%s", dir, gp->uuid);
    snprintf(tmp, sizeof tmp, "%s/.%s.%d.%lx.tmp", dir, gp->uuid, (int)getpid(), (unsigned long)pthread_self());
    FILE *f = fopen(tmp, "we");
    if (!f) return -1;
    fprintf(f, "%s\ncounter %u\n", LAYOUT_HEADER, l->counter);
    for (int k = 0; k < l->n_gi; k++) {
        const lay_gi *gi = &l->gi[k];
        fprintf(f, "gi %u %d %d %d %d %u %llu %u %s\n", gi->id, gi->profile_index, gi->profile_id, gi->start,
                gi->size, gi->slices, gi->mem_mib, gi->serial, gi->name);
    }
    for (int k = 0; k < l->n_ci; k++) {
        const lay_ci *ci = &l->ci[k];
        fprintf(f, "ci %u %u %d %u %u %llu %s %s\n", ci->gi, ci->ci, ci->profile_id, ci->start, ci->slices,
                ci->mem_mib, ci->uuid, ci->profile);
    }
    int ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) < 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* Exclusive right to change layouts: this process's mig_lock plus, with a state dir, mig/.lock. */
static int layout_lock(void) {
    pthread_mutex_lock(&mig_lock);
    char dir[1200], path[1300];
    if (state_path(dir, sizeof dir, "mig", NULL) < 0) return -1;
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0)
        while (flock(fd, LOCK_EX) < 0 && errno == EINTR) {
        }
    return fd;
}

static void layout_unlock(int fd) {
    if (fd >= 0) close(fd); /* releases the flock */
    pthread_mutex_unlock(&mig_lock);
}

static int take_slot(int live_flags[MAX_SLOTS], const unsigned long long freed[MAX_SLOTS]) {
    int best = -1;
    for (int k = 0; k < MAX_SLOTS; k++)
        if (!live_flags[k] && (best < 0 || freed[k] < freed[best])) best = k;
    live_flags[best] = 1;
    return best;
}

/* Shows layout l in GPU i's slots: an instance still there keeps its slot (and handle), gone ones free
 * theirs, new ones take the slot freed longest ago. Caller holds mig_lock. */
static void apply_layout(int i, const sim_layout *l) {
    sim_gpu *gp = &g.gpus[i];
    int gi_live[MAX_SLOTS], ci_live[MAX_SLOTS], gi_of[MAX_GI], ci_of[MAX_MIG];
    unsigned long long gi_freed[MAX_SLOTS], ci_freed[MAX_SLOTS];
    for (int k = 0; k < MAX_SLOTS; k++) {
        gi_live[k] = 0, ci_live[k] = 0;
        gi_freed[k] = gp->gis[k].freed, ci_freed[k] = gp->mig[k].freed;
    }
    for (int a = 0; a < l->n_gi; a++) {
        gi_of[a] = -1;
        for (int k = 0; k < MAX_SLOTS && gi_of[a] < 0; k++)
            if (gp->gis[k].live && memcmp(&gp->gis[k].gi, &l->gi[a], sizeof l->gi[a]) == 0) gi_of[a] = k;
        if (gi_of[a] >= 0) gi_live[gi_of[a]] = 1;
    }
    for (int a = 0; a < l->n_ci; a++) {
        ci_of[a] = -1;
        for (int k = 0; k < MAX_SLOTS && ci_of[a] < 0; k++)
            if (gp->mig[k].live && memcmp(&gp->mig[k].c, &l->ci[a], sizeof l->ci[a]) == 0) ci_of[a] = k;
        if (ci_of[a] >= 0) ci_live[ci_of[a]] = 1;
    }
    for (int k = 0; k < MAX_SLOTS; k++) {
        if (gp->gis[k].live && !gi_live[k]) gp->gis[k].live = 0, gp->gis[k].freed = gi_freed[k] = ++free_clock;
        if (gp->mig[k].live && !ci_live[k]) gp->mig[k].live = 0, gp->mig[k].freed = ci_freed[k] = ++free_clock;
    }
    for (int a = 0; a < l->n_gi; a++) {
        if (gi_of[a] >= 0) continue;
        gi_slot *s = &gp->gis[gi_of[a] = take_slot(gi_live, gi_freed)];
        s->handle = (sim_gi){GI_MAGIC, i, gi_of[a]};
        memcpy(&s->gi, &l->gi[a], sizeof s->gi);
        s->live = 1;
    }
    for (int a = 0; a < l->n_ci; a++) {
        const lay_ci *c = &l->ci[a];
        int fresh = ci_of[a] < 0;
        if (fresh) ci_of[a] = take_slot(ci_live, ci_freed);
        sim_mig *m = &gp->mig[ci_of[a]];
        int gslot = -1;
        for (int b = 0; b < l->n_gi; b++)
            if (l->gi[b].id == c->gi) gslot = gi_of[b];
        const lay_gi *gi = gslot >= 0 ? &l->gi[0] : NULL;
        for (int b = 0; b < l->n_gi; b++)
            if (l->gi[b].id == c->gi) gi = &l->gi[b];
        m->index = a;
        m->gi_slot = gslot;
        m->gi_profile_id = gi ? gi->profile_id : -1;
        m->placement_start = gi ? gi->start : -1;
        m->placement_size = gi ? gi->size : -1;
        gp->order[a] = ci_of[a];
        if (!fresh) continue;
        m->h = (sim_handle){HANDLE_MAGIC, i, ci_of[a]};
        m->ci_handle = (sim_ci){CI_MAGIC, i, ci_of[a]};
        memcpy(&m->c, c, sizeof m->c);
        snprintf(m->uuid, sizeof m->uuid, "%s", c->uuid);
        snprintf(m->profile, sizeof m->profile, "%s", c->profile);
        m->gi = c->gi;
        m->ci = c->ci;
        m->mem = c->mem_mib * 1024ULL * 1024ULL;
        m->live = 1;
    }
    gp->n_mig = l->n_ci;
    memcpy(&gp->applied, l, sizeof *l);
    gp->applied_valid = 1;
}

/* Brings GPU i's slots up to its current layout (another process may have changed it). */
static void sync_gpu(int i) {
    if (!g.gpus[i].mig_capable) return;
    sim_layout l;
    pthread_mutex_lock(&mig_lock);
    current_layout(i, &l);
    if (!g.gpus[i].applied_valid || memcmp(&l, &g.gpus[i].applied, sizeof l) != 0) apply_layout(i, &l);
    pthread_mutex_unlock(&mig_lock);
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
            /* A profile named but absent (a name the stand-in images lack): say which, not only "no driver". */
            if (profile && *profile) fprintf(stderr, "nvml-sim: no node profile at %s (NVML_SIM_PROFILE)\n", profile);
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
    case 19: return "In use by another client";
    case 23: return "Insufficient resources";
    case 25: return "Argument version mismatch";
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
    if (d->magic != HANDLE_MAGIC || d->gpu < 0 || d->gpu >= g.n) return 0;
    if (d->mig < 0) return d->mig == -1;
    if (d->mig >= MAX_SLOTS) return 0;
    sync_gpu(d->gpu); /* a MIG device lives as long as its instance does */
    return g.gpus[d->gpu].mig[d->mig].live;
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
        sync_gpu(i);
        for (int j = 0; j < MAX_SLOTS; j++)
            if (g.gpus[i].mig[j].live && strcmp(g.gpus[i].mig[j].uuid, uuid) == 0) {
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
    *index = (unsigned)(IS_MIG(d) ? MIG(d)->index : d->gpu);
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
    int file = mig_mode_file(d->gpu); /* set_mig_mode: current and pending alike */
    *current = (unsigned)(file >= 0 ? file : GPU(d)->mig_enabled);
    *pending = (unsigned)(file >= 0 ? file : GPU(d)->mig_pending);
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
    pthread_mutex_lock(&mig_lock);
    sync_gpu(d->gpu);
    r = !mig_on(d->gpu) || index >= (unsigned)GPU(d)->n_mig ? NVML_ERROR_NOT_FOUND : NVML_SUCCESS;
    if (!r) *mig = &GPU(d)->mig[GPU(d)->order[index]].h;
    pthread_mutex_unlock(&mig_lock);
    return r;
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

/* ---------------------------------------------------------------- MIG: GPU and compute instances
 *
 * Profiles and possible placements come from the profile's mig_profiles; instances live in the layout
 * (above). Refusals follow nvml.h's documented return codes (sim/nvml/README.md lists each). */

typedef struct {
    unsigned int start, size;
} nvmlGpuInstancePlacement_t;

typedef struct {
    nvmlDevice_t device;
    unsigned int id, profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

typedef struct {
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

typedef struct {
    unsigned int version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} nvmlGpuInstanceProfileInfo_v2_t;

typedef struct {
    unsigned int version, id, sliceCount, instanceCount, multiprocessorCount, copyEngineCount, decoderCount,
        encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
    unsigned int capabilities;
} nvmlGpuInstanceProfileInfo_v3_t;

/* NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2 / 3): the struct's size with the version in the top byte. */
#define GI_PROFILE_INFO_V2 ((unsigned)sizeof(nvmlGpuInstanceProfileInfo_v2_t) | (2u << 24))
#define GI_PROFILE_INFO_V3 ((unsigned)sizeof(nvmlGpuInstanceProfileInfo_v3_t) | (3u << 24))
_Static_assert(GI_PROFILE_INFO_V2 == 0x02000098u, "nvmlGpuInstanceProfileInfo_v2 as pynvml sets it");
_Static_assert(sizeof(nvmlGpuInstanceProfileInfo_v3_t) == 0x98, "nvmlGpuInstanceProfileInfo_v3_t");

typedef struct {
    unsigned int id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount,
        sharedEncoderCount, sharedJpegCount, sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;

typedef struct {
    unsigned int version, id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
    char name[96];
} nvmlComputeInstanceProfileInfo_v2_t;

typedef struct {
    unsigned int version, id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
    char name[96];
    unsigned int capabilities;
} nvmlComputeInstanceProfileInfo_v3_t;

#define CI_PROFILE_INFO_V2 ((unsigned)sizeof(nvmlComputeInstanceProfileInfo_v2_t) | (2u << 24))
#define CI_PROFILE_INFO_V3 ((unsigned)sizeof(nvmlComputeInstanceProfileInfo_v3_t) | (3u << 24))
_Static_assert(CI_PROFILE_INFO_V2 == 0x02000088u, "nvmlComputeInstanceProfileInfo_v2 as pynvml sets it");

typedef struct {
    unsigned int start, size;
} nvmlComputeInstancePlacement_t;

typedef struct {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id, profileId;
    nvmlComputeInstancePlacement_t placement;
} nvmlComputeInstanceInfo_t;

/* Compute slices of each NVML_COMPUTE_INSTANCE_PROFILE_* (1, 2, 3, 4, 7, 8, 6, 1_REV1, 7_NVL). */
static const unsigned ci_profile_slices[CI_PROFILE_COUNT] = {1, 2, 3, 4, 7, 8, 6, 1, 7};

static int in_gpus(const void *p) {
    return p && (uintptr_t)p >= (uintptr_t)&g.gpus[0] && (uintptr_t)p < (uintptr_t)&g.gpus[MAX_GPUS];
}

/* A live GPU instance handle of an answering GPU. */
static nvmlReturn_t check_gi(nvmlGpuInstance_t gi) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!in_gpus(gi) || gi->magic != GI_MAGIC || gi->gpu < 0 || gi->gpu >= g.n || gi->slot < 0 ||
        gi->slot >= MAX_SLOTS)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = gpu_gate(gi->gpu);
    if (r) return r;
    sync_gpu(gi->gpu);
    return g.gpus[gi->gpu].gis[gi->slot].live ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

static nvmlReturn_t check_ci(nvmlComputeInstance_t ci) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!in_gpus(ci) || ci->magic != CI_MAGIC || ci->gpu < 0 || ci->gpu >= g.n || ci->slot < 0 ||
        ci->slot >= MAX_SLOTS)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = gpu_gate(ci->gpu);
    if (r) return r;
    sync_gpu(ci->gpu);
    return g.gpus[ci->gpu].mig[ci->slot].live ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

static const lay_gi *layout_gi(const sim_layout *l, unsigned id) {
    for (int k = 0; k < l->n_gi; k++)
        if (l->gi[k].id == id) return &l->gi[k];
    return NULL;
}

/* The GPU instance id the driver gives a placement: its node in the binary tree of the 8 memory slices
 * (0 the whole GPU, 1-2 halves, 3-6 quarters, 7-14 single slices), as nvidia-smi mig -lgi shows them;
 * the lowest free id where that one is taken (only a profile's made-up static ids can take it). */
static unsigned gi_id_for(const sim_layout *l, unsigned start, unsigned size) {
    int id = size == 8 ? 0 : size == 4 ? 1 + (int)start / 4 : size == 2 ? 3 + (int)start / 2 : size == 1 ? 7 + (int)start : -1;
    if (id >= 0 && !layout_gi(l, (unsigned)id)) return (unsigned)id;
    unsigned free_id = 0;
    while (layout_gi(l, free_id)) free_id++;
    return free_id;
}

/* Whether a GI of profile p fits at (start, size) next to layout l: SUCCESS or INSUFFICIENT_RESOURCES
 * (the profile's instanceCount reached, not enough compute slices left, memory slices taken). */
static nvmlReturn_t gi_fits(const sim_layout *l, const sim_profile *p, unsigned start, unsigned size) {
    unsigned same = 0, used = 0;
    for (int k = 0; k < l->n_gi; k++) {
        const lay_gi *o = &l->gi[k];
        used += o->slices;
        if (o->profile_id == (int)p->id) same++;
        if (o->start >= 0 && (int)start < o->start + o->size && o->start < (int)(start + size))
            return NVML_ERROR_INSUFFICIENT_RESOURCES;
    }
    if (same >= p->instances || used + p->slices > COMPUTE_SLICES || l->n_gi >= MAX_GI)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    return NVML_SUCCESS;
}

/* The first possible placement of p that fits, in the profile's order; -1 when none does. */
static int first_fit(const sim_layout *l, const sim_profile *p) {
    for (int q = 0; q < p->n_place; q++)
        if (gi_fits(l, p, p->place_start[q], p->place_size[q]) == NVML_SUCCESS) return q;
    return -1;
}

static void add_gi(sim_layout *l, const sim_gpu *gp, const sim_profile *p, int q) {
    lay_gi *gi = &l->gi[l->n_gi];
    memset(gi, 0, sizeof *gi);
    gi->id = gi_id_for(l, p->place_start[q], p->place_size[q]);
    gi->serial = ++l->counter;
    gi->profile_index = (int)(p - gp->prof);
    gi->profile_id = (int)p->id;
    gi->start = (int)p->place_start[q];
    gi->size = (int)p->place_size[q];
    gi->slices = p->slices;
    gi->mem_mib = p->mem_mib;
    snprintf(gi->name, sizeof gi->name, "%s", p->name);
    l->n_gi++;
}

/* Queries that answer for a MIG-capable GPU whatever its MIG mode (profiles, placements, capacity). */
static nvmlReturn_t check_mig_gpu(nvmlDevice_t d) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (IS_MIG(d) || !GPU(d)->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

static nvmlReturn_t gi_profile(nvmlDevice_t d, unsigned index, const sim_profile **p) {
    nvmlReturn_t r = check_mig_gpu(d);
    if (r) return r;
    if (index >= PROFILE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    if (!GPU(d)->prof[index].present) return NVML_ERROR_NOT_SUPPORTED;
    *p = &GPU(d)->prof[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t d, unsigned int index,
                                                        nvmlGpuInstanceProfileInfo_t *info) {
    const sim_profile *p = NULL;
    nvmlReturn_t r = gi_profile(d, index, &p);
    if (r) return r;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    *info = (nvmlGpuInstanceProfileInfo_t){p->id, 0, p->slices, p->instances, p->sms, p->ce, p->dec, p->enc,
                                           p->jpeg, p->ofa, p->mem_mib};
    return NVML_SUCCESS;
}

/* Takes the v2 and v3 structs (they differ in isP2pSupported / capabilities, both 0 here). Answers with
 * MIG mode off too, as driver 580 on an H100 did (docs/mig-nvml-h100.md), though nvml.h names MIG mode. */
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t d, unsigned int index, void *info) {
    const sim_profile *p = NULL;
    nvmlReturn_t r = gi_profile(d, index, &p);
    if (r) return r;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned version = *(unsigned *)info;
    if (version == GI_PROFILE_INFO_V2) {
        nvmlGpuInstanceProfileInfo_v2_t *v = info;
        *v = (nvmlGpuInstanceProfileInfo_v2_t){version, p->id, 0, p->slices, p->instances, p->sms, p->ce, p->dec,
                                               p->enc, p->jpeg, p->ofa, p->mem_mib, {0}};
        snprintf(v->name, sizeof v->name, "%s", p->name);
    } else if (version == GI_PROFILE_INFO_V3) {
        nvmlGpuInstanceProfileInfo_v3_t *v = info;
        *v = (nvmlGpuInstanceProfileInfo_v3_t){version, p->id, p->slices, p->instances, p->sms, p->ce, p->dec,
                                               p->enc, p->jpeg, p->ofa, p->mem_mib, {0}, 0};
        snprintf(v->name, sizeof v->name, "%s", p->name);
    } else {
        return NVML_ERROR_INVALID_ARGUMENT; /* nvml.h: "info->version" invalid */
    }
    return NVML_SUCCESS;
}

/* Every placement the profile can take, MIG mode on or off; NULL placements: only the count. */
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t d, unsigned int profile_id,
                                                                  nvmlGpuInstancePlacement_t *placements,
                                                                  unsigned int *count) {
    nvmlReturn_t r = check_mig_gpu(d);
    if (r) return r;
    const sim_profile *p = profile_by_id(GPU(d), (int)profile_id);
    if (!count || !p) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = (unsigned)p->n_place;
    if (!placements) {
        *count = n;
        return NVML_SUCCESS;
    }
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned q = 0; q < n; q++) placements[q] = (nvmlGpuInstancePlacement_t){p->place_start[q], p->place_size[q]};
    *count = n;
    return NVML_SUCCESS;
}

/* How many more instances of the profile could be made now, each at its first free placement. */
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t d, unsigned int profile_id,
                                                              unsigned int *count) {
    nvmlReturn_t r = check_mig_gpu(d);
    if (r) return r;
    const sim_profile *p = profile_by_id(GPU(d), (int)profile_id);
    if (!count || !p) return NVML_ERROR_INVALID_ARGUMENT;
    sim_layout l;
    pthread_mutex_lock(&mig_lock);
    current_layout(d->gpu, &l);
    pthread_mutex_unlock(&mig_lock);
    unsigned n = 0;
    for (int q; (q = first_fit(&l, p)) >= 0; n++) add_gi(&l, GPU(d), p, q);
    *count = n;
    return NVML_SUCCESS;
}

static nvmlReturn_t create_gi(nvmlDevice_t d, unsigned profile_id, const nvmlGpuInstancePlacement_t *want,
                              nvmlGpuInstance_t *out) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (!out || IS_MIG(d)) return NVML_ERROR_INVALID_ARGUMENT;
    if (!GPU(d)->mig_capable || !mig_on(d->gpu)) return NVML_ERROR_NOT_SUPPORTED;
    const sim_profile *p = profile_by_id(GPU(d), (int)profile_id);
    if (!p) return NVML_ERROR_INVALID_ARGUMENT;
    int q = -1;
    if (want) {
        for (int k = 0; k < p->n_place && q < 0; k++)
            if (p->place_start[k] == want->start && p->place_size[k] == want->size) q = k;
        if (q < 0) return NVML_ERROR_INVALID_ARGUMENT; /* not one of the profile's possible placements */
    }
    int fd = layout_lock();
    sim_layout l;
    current_layout(d->gpu, &l);
    if (want) {
        r = gi_fits(&l, p, p->place_start[q], p->place_size[q]);
    } else {
        q = first_fit(&l, p);
        r = q < 0 ? NVML_ERROR_INSUFFICIENT_RESOURCES : NVML_SUCCESS;
    }
    if (!r) {
        add_gi(&l, GPU(d), p, q);
        unsigned id = l.gi[l.n_gi - 1].id;
        if (write_layout(d->gpu, &l) < 0) {
            r = NVML_ERROR_UNKNOWN;
        } else {
            sync_gpu(d->gpu);
            r = NVML_ERROR_UNKNOWN;
            for (int k = 0; k < MAX_SLOTS; k++)
                if (GPU(d)->gis[k].live && GPU(d)->gis[k].gi.id == id) *out = &GPU(d)->gis[k].handle, r = NVML_SUCCESS;
        }
    }
    layout_unlock(fd);
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t d, unsigned int profile_id, nvmlGpuInstance_t *gi) {
    FAULT_POINT(create_gi(d, profile_id, NULL, gi));
}

EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t d, unsigned int profile_id,
                                                             const nvmlGpuInstancePlacement_t *placement,
                                                             nvmlGpuInstance_t *gi) {
    FAULT_POINT(placement ? create_gi(d, profile_id, placement, gi)
                          : initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED);
}

static nvmlReturn_t destroy_gi(nvmlGpuInstance_t gi) {
    nvmlReturn_t r = check_gi(gi);
    if (r) return r;
    int fd = layout_lock();
    sim_layout l;
    current_layout(gi->gpu, &l);
    const gi_slot *s = &g.gpus[gi->gpu].gis[gi->slot];
    int k;
    for (k = 0; k < l.n_gi && memcmp(&l.gi[k], &s->gi, sizeof s->gi) != 0; k++) {
    }
    if (!s->live || k == l.n_gi) {
        r = NVML_ERROR_INVALID_ARGUMENT; /* destroyed meanwhile */
    } else {
        for (int c = 0; c < l.n_ci; c++)
            if (l.ci[c].gi == l.gi[k].id) r = NVML_ERROR_IN_USE; /* destroy its compute instances first */
        if (!r) {
            memmove(&l.gi[k], &l.gi[k + 1], sizeof l.gi[0] * (size_t)(l.n_gi - k - 1));
            memset(&l.gi[--l.n_gi], 0, sizeof l.gi[0]);
            r = write_layout(gi->gpu, &l) < 0 ? NVML_ERROR_UNKNOWN : NVML_SUCCESS;
            sync_gpu(gi->gpu);
        }
    }
    layout_unlock(fd);
    return r;
}

EXPORT nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gi) { FAULT_POINT(destroy_gi(gi)); }

/* Instances need MIG mode on; a MIG handle is not a GPU. */
static nvmlReturn_t check_mig_on(nvmlDevice_t d) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (IS_MIG(d)) return NVML_ERROR_INVALID_ARGUMENT;
    if (!GPU(d)->mig_capable || !mig_on(d->gpu)) return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t d, unsigned int profile_id, nvmlGpuInstance_t *gis,
                                              unsigned int *count) {
    nvmlReturn_t r = check_mig_on(d);
    if (r) return r;
    if (!gis || !count || !profile_by_id(GPU(d), (int)profile_id)) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&mig_lock);
    sync_gpu(d->gpu);
    unsigned n = 0;
    const sim_layout *l = &GPU(d)->applied;
    for (int a = 0; a < l->n_gi; a++) {
        if (l->gi[a].profile_id != (int)profile_id) continue;
        for (int k = 0; k < MAX_SLOTS; k++)
            if (GPU(d)->gis[k].live && GPU(d)->gis[k].gi.id == l->gi[a].id) gis[n++] = &GPU(d)->gis[k].handle;
    }
    pthread_mutex_unlock(&mig_lock);
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t d, unsigned int id, nvmlGpuInstance_t *gi) {
    nvmlReturn_t r = check_mig_on(d);
    if (r) return r;
    if (!gi) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&mig_lock);
    sync_gpu(d->gpu);
    r = NVML_ERROR_NOT_FOUND;
    for (int k = 0; k < MAX_SLOTS; k++) {
        gi_slot *s = &GPU(d)->gis[k];
        if (!s->live || s->gi.id != id) continue;
        if (s->gi.profile_id < 0) {
            r = NVML_ERROR_NOT_SUPPORTED; /* a static GI of a size without a known profile */
        } else {
            *gi = &s->handle;
            r = NVML_SUCCESS;
        }
    }
    pthread_mutex_unlock(&mig_lock);
    return r;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gi, nvmlGpuInstanceInfo_t *info) {
    nvmlReturn_t r = check_gi(gi);
    if (r) return r;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    const lay_gi *s = &g.gpus[gi->gpu].gis[gi->slot].gi;
    info->device = &g.gpus[gi->gpu].h;
    info->id = s->id;
    info->profileId = (unsigned)s->profile_id;
    info->placement.start = (unsigned)s->start;
    info->placement.size = (unsigned)s->size;
    return NVML_SUCCESS;
}

/* A compute-instance profile a GI of `slices` compute slices offers: up to its size (1, 2, 3, 4, 7). */
static int ci_offered(unsigned profile, unsigned slices) {
    return profile <= 4 && ci_profile_slices[profile] <= slices;
}

static nvmlReturn_t ci_profile_info(nvmlGpuInstance_t gi, unsigned profile, unsigned eng,
                                    nvmlComputeInstanceProfileInfo_t *out, char *name, size_t name_len) {
    nvmlReturn_t r = check_gi(gi);
    if (r) return r;
    if (profile >= CI_PROFILE_COUNT || eng != 0) return NVML_ERROR_INVALID_ARGUMENT;
    const sim_gpu *gp = &g.gpus[gi->gpu];
    const lay_gi *s = &gp->gis[gi->slot].gi;
    if (!ci_offered(profile, s->slices)) return NVML_ERROR_NOT_SUPPORTED;
    const sim_profile *p = profile_by_id(gp, s->profile_id);
    unsigned n = ci_profile_slices[profile];
    unsigned sms = p ? p->sms : s->slices * 16;
    /* A CI gets its share of the GI's SMs and shares the GI's engines. */
    *out = (nvmlComputeInstanceProfileInfo_t){profile, n, s->slices / n, sms * n / s->slices, p ? p->ce : 0,
                                              p ? p->dec : 0, p ? p->enc : 0, p ? p->jpeg : 0, p ? p->ofa : 0};
    if (n == s->slices)
        snprintf(name, name_len, "%s", s->name);
    else
        snprintf(name, name_len, "%uc.%s", n, s->name);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gi, unsigned int profile,
                                                                 unsigned int eng_profile,
                                                                 nvmlComputeInstanceProfileInfo_t *info) {
    char name[96];
    if (!info) return initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    return ci_profile_info(gi, profile, eng_profile, info, name, sizeof name);
}

/* Takes the v2 and v3 structs (v3 adds capabilities, 0 here). */
EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gi, unsigned int profile,
                                                                  unsigned int eng_profile, void *info) {
    if (!info) return initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    unsigned version = *(unsigned *)info;
    if (version != CI_PROFILE_INFO_V2 && version != CI_PROFILE_INFO_V3) {
        nvmlReturn_t r = check_gi(gi);
        return r ? r : NVML_ERROR_INVALID_ARGUMENT; /* nvml.h: "info->version" invalid */
    }
    nvmlComputeInstanceProfileInfo_t v1;
    nvmlComputeInstanceProfileInfo_v3_t *v = info; /* v2 is v3 without the trailing capabilities */
    char name[96];
    nvmlReturn_t r = ci_profile_info(gi, profile, eng_profile, &v1, name, sizeof name);
    if (r) return r;
    memcpy(&v->id, &v1, sizeof v1);
    snprintf(v->name, sizeof v->name, "%s", name);
    if (version == CI_PROFILE_INFO_V3) v->capabilities = 0;
    return NVML_SUCCESS;
}

/* The first compute-slice offset in the GI where `n` slices are free, or -1. */
static int ci_start(const sim_layout *l, const lay_gi *gi, unsigned n) {
    unsigned used = 0;
    for (int c = 0; c < l->n_ci; c++)
        if (l->ci[c].gi == gi->id)
            for (unsigned k = 0; k < l->ci[c].slices && l->ci[c].start + k < 32; k++) used |= 1u << (l->ci[c].start + k);
    for (unsigned start = 0; start + n <= gi->slices; start++) {
        unsigned mask = ((1u << n) - 1) << start;
        if (!(used & mask)) return (int)start;
    }
    return -1;
}

static unsigned long long fnv1a(const char *s, unsigned long long h) {
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return h;
}

/* A new MIG device's UUID: a hash of the GPU's UUID, GI and CI ids, the layout counter and the time. */
static void make_mig_uuid(char *dst, size_t len, const char *gpu_uuid, unsigned gi, unsigned ci, unsigned counter) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char key[256];
    snprintf(key, sizeof key, "%s/%u/%u/%u/%lld.%09ld", gpu_uuid, gi, ci, counter, (long long)ts.tv_sec, ts.tv_nsec);
    unsigned long long a = fnv1a(key, 0xcbf29ce484222325ULL), b = fnv1a(key, a ^ 0x9e3779b97f4a7c15ULL);
    snprintf(dst, len, "MIG-%08llx-%04llx-%04llx-%04llx-%012llx", a >> 32, (a >> 16) & 0xffff,
             (a & 0x0fff) | 0x5000, ((b >> 48) & 0x3fff) | 0x8000, b & 0xffffffffffffULL);
}

static nvmlReturn_t create_ci(nvmlGpuInstance_t gi, unsigned int profile, nvmlComputeInstance_t *out) {
    nvmlReturn_t r = check_gi(gi);
    if (r) return r;
    sim_gpu *gp = &g.gpus[gi->gpu];
    if (!out || profile >= CI_PROFILE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    if (!ci_offered(profile, gp->gis[gi->slot].gi.slices)) return NVML_ERROR_NOT_SUPPORTED;
    int fd = layout_lock();
    sim_layout l;
    current_layout(gi->gpu, &l);
    const lay_gi *s = NULL;
    for (int k = 0; k < l.n_gi; k++)
        if (memcmp(&l.gi[k], &gp->gis[gi->slot].gi, sizeof l.gi[k]) == 0) s = &l.gi[k];
    unsigned n = ci_profile_slices[profile], same = 0;
    for (int c = 0; s && c < l.n_ci; c++)
        if (l.ci[c].gi == s->id && l.ci[c].profile_id == (int)profile) same++;
    int start = s ? ci_start(&l, s, n) : -1;
    if (!s) {
        r = NVML_ERROR_INVALID_ARGUMENT; /* destroyed meanwhile */
    } else if (start < 0 || same >= s->slices / n || l.n_ci >= MAX_MIG) {
        r = NVML_ERROR_INSUFFICIENT_RESOURCES;
    } else {
        lay_ci *c = &l.ci[l.n_ci];
        memset(c, 0, sizeof *c);
        c->gi = s->id;
        while (1) { /* the lowest CI id free in the GI */
            int taken = 0;
            for (int k = 0; k < l.n_ci; k++) taken |= l.ci[k].gi == s->id && l.ci[k].ci == c->ci;
            if (!taken) break;
            c->ci++;
        }
        c->profile_id = (int)profile;
        c->start = (unsigned)start;
        c->slices = n;
        c->mem_mib = s->mem_mib;
        if (n == s->slices)
            snprintf(c->profile, sizeof c->profile, "%s", s->name);
        else
            snprintf(c->profile, sizeof c->profile, "%uc.%s", n, s->name);
        make_mig_uuid(c->uuid, sizeof c->uuid, gp->uuid, c->gi, c->ci, ++l.counter);
        char uuid[96];
        snprintf(uuid, sizeof uuid, "%s", c->uuid);
        l.n_ci++;
        if (write_layout(gi->gpu, &l) < 0) {
            r = NVML_ERROR_UNKNOWN;
        } else {
            sync_gpu(gi->gpu);
            r = NVML_ERROR_UNKNOWN;
            for (int k = 0; k < MAX_SLOTS; k++)
                if (gp->mig[k].live && strcmp(gp->mig[k].uuid, uuid) == 0) *out = &gp->mig[k].ci_handle, r = NVML_SUCCESS;
        }
    }
    layout_unlock(fd);
    return r;
}

EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gi, unsigned int profile,
                                                         nvmlComputeInstance_t *out) {
    FAULT_POINT(create_ci(gi, profile, out));
}

static nvmlReturn_t destroy_ci(nvmlComputeInstance_t ci) {
    nvmlReturn_t r = check_ci(ci);
    if (r) return r;
    int fd = layout_lock();
    sim_layout l;
    current_layout(ci->gpu, &l);
    const sim_mig *m = &g.gpus[ci->gpu].mig[ci->slot];
    int k;
    for (k = 0; k < l.n_ci && strcmp(l.ci[k].uuid, m->uuid) != 0; k++) {
    }
    if (!m->live || k == l.n_ci) {
        r = NVML_ERROR_INVALID_ARGUMENT; /* destroyed meanwhile */
    } else {
        memmove(&l.ci[k], &l.ci[k + 1], sizeof l.ci[0] * (size_t)(l.n_ci - k - 1));
        memset(&l.ci[--l.n_ci], 0, sizeof l.ci[0]);
        r = write_layout(ci->gpu, &l) < 0 ? NVML_ERROR_UNKNOWN : NVML_SUCCESS;
        sync_gpu(ci->gpu);
    }
    layout_unlock(fd);
    return r;
}

EXPORT nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t ci) { FAULT_POINT(destroy_ci(ci)); }

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(nvmlGpuInstance_t gi, unsigned int profile,
                                                                       unsigned int *count) {
    nvmlReturn_t r = check_gi(gi);
    if (r) return r;
    if (!count || profile >= CI_PROFILE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    sim_gpu *gp = &g.gpus[gi->gpu];
    const lay_gi *s = &gp->gis[gi->slot].gi;
    if (!ci_offered(profile, s->slices)) return NVML_ERROR_NOT_SUPPORTED;
    sim_layout l;
    pthread_mutex_lock(&mig_lock);
    memcpy(&l, &gp->applied, sizeof l);
    pthread_mutex_unlock(&mig_lock);
    unsigned n = ci_profile_slices[profile], same = 0, left = 0;
    for (int c = 0; c < l.n_ci; c++) same += l.ci[c].gi == s->id && l.ci[c].profile_id == (int)profile;
    while (same + left < s->slices / n && l.n_ci < MAX_MIG) {
        int start = ci_start(&l, s, n);
        if (start < 0) break;
        l.ci[l.n_ci++] = (lay_ci){.gi = s->id, .start = (unsigned)start, .slices = n};
        left++;
    }
    *count = left;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gi, unsigned int profile,
                                                       nvmlComputeInstance_t *cis, unsigned int *count) {
    nvmlReturn_t r = check_gi(gi);
    if (r) return r;
    if (!cis || !count || profile >= CI_PROFILE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    sim_gpu *gp = &g.gpus[gi->gpu];
    unsigned n = 0;
    pthread_mutex_lock(&mig_lock);
    for (int a = 0; a < gp->n_mig; a++) {
        sim_mig *m = &gp->mig[gp->order[a]];
        if (m->gi_slot == gi->slot && m->c.profile_id == (int)profile) cis[n++] = &m->ci_handle;
    }
    pthread_mutex_unlock(&mig_lock);
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gi, unsigned int id,
                                                          nvmlComputeInstance_t *ci) {
    nvmlReturn_t r = check_gi(gi);
    if (r) return r;
    if (!ci) return NVML_ERROR_INVALID_ARGUMENT;
    sim_gpu *gp = &g.gpus[gi->gpu];
    r = NVML_ERROR_NOT_FOUND;
    pthread_mutex_lock(&mig_lock);
    for (int a = 0; a < gp->n_mig; a++) {
        sim_mig *m = &gp->mig[gp->order[a]];
        if (m->gi_slot == gi->slot && m->ci == id) *ci = &m->ci_handle, r = NVML_SUCCESS;
    }
    pthread_mutex_unlock(&mig_lock);
    return r;
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t ci, nvmlComputeInstanceInfo_t *info) {
    nvmlReturn_t r = check_ci(ci);
    if (r) return r;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    sim_gpu *gp = &g.gpus[ci->gpu];
    const sim_mig *m = &gp->mig[ci->slot];
    info->device = &gp->h; /* the parent GPU, as nvml.h says */
    info->gpuInstance = m->gi_slot >= 0 ? &gp->gis[m->gi_slot].handle : NULL;
    info->id = m->ci;
    info->profileId = (unsigned)m->c.profile_id;
    info->placement.start = m->c.start;
    info->placement.size = m->c.slices;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t ci, nvmlComputeInstanceInfo_t *info) {
    return nvmlComputeInstanceGetInfo_v2(ci, info);
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

static nvmlReturn_t set_compute_mode(nvmlDevice_t d, int mode) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (IS_MIG(d)) return NVML_ERROR_NOT_SUPPORTED;
    if (mode < 0 || mode > 3) return NVML_ERROR_INVALID_ARGUMENT;
    if (mode == 1) return NVML_ERROR_NOT_SUPPORTED; /* EXCLUSIVE_THREAD was removed from NVML */
    return write_compute_mode(d->gpu, mode) == 0 ? NVML_SUCCESS : NVML_ERROR_NO_PERMISSION;
}

EXPORT nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t d, int mode) { FAULT_POINT(set_compute_mode(d, mode)); }

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
                        sync_gpu(i); /* dynamic MIG devices too, while they live */
                        for (int j = 0; j < MAX_SLOTS; j++)
                            if (g.gpus[i].mig[j].live && strcmp(g.gpus[i].mig[j].uuid, uuid) == 0) mig = j;
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

/* ---------------------------------------------------------------- MIG mode switch
 *
 * nvmlDeviceSetMigMode: Hopper and later switch at once (mig-mode/<uuid>, as set_mig_mode writes it);
 * Ampere and older leave the switch pending a GPU reset: the current mode stays and *activationStatus is
 * NVML_ERROR_RESET_REQUIRED while the call itself succeeds (NVIDIA's MIG user guide: "Setting MIG mode on
 * the A100/A30 requires a GPU reset"). Refused with NVML_ERROR_IN_USE while the GPU has GPU instances. */

#define NVML_ERROR_RESET_REQUIRED_ 14
#define ARCH_HOPPER 9

static nvmlReturn_t set_mig_mode(nvmlDevice_t d, unsigned int mode, nvmlReturn_t *activationStatus) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (!activationStatus || mode > 1) return NVML_ERROR_INVALID_ARGUMENT;
    if (IS_MIG(d) || !GPU(d)->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    int fd = layout_lock();
    sim_layout l;
    current_layout(d->gpu, &l);
    *activationStatus = NVML_SUCCESS;
    if ((int)mode == mig_on(d->gpu)) {
        r = NVML_SUCCESS;
    } else if (l.n_gi > 0) {
        r = NVML_ERROR_IN_USE;
    } else if (GPU(d)->arch == ARCH_UNKNOWN || GPU(d)->arch < ARCH_HOPPER) {
        *activationStatus = (nvmlReturn_t)NVML_ERROR_RESET_REQUIRED_;
        r = NVML_SUCCESS;
    } else {
        char dir[1200], path[1300], tmp[1400];
        r = NVML_ERROR_UNKNOWN;
        if (state_path(dir, sizeof dir, "mig-mode", NULL) < 0) { /* no state dir: this process only */
            GPU(d)->mig_enabled = (int)mode;
            r = NVML_SUCCESS;
        } else {
            mkdir(dir, 0755);
            snprintf(path, sizeof path, "%s/%s", dir, GPU(d)->uuid);
            snprintf(tmp, sizeof tmp, "%s/.%s.%d.tmp", dir, GPU(d)->uuid, (int)getpid());
            FILE *f = fopen(tmp, "we");
            if (f) {
                int ok = fputs(mode ? "1\n" : "0\n", f) >= 0;
                ok = fclose(f) == 0 && ok;
                if (ok && rename(tmp, path) == 0) r = NVML_SUCCESS;
                else unlink(tmp);
            }
        }
    }
    layout_unlock(fd);
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t d, unsigned int mode, nvmlReturn_t *activationStatus) {
    FAULT_POINT(set_mig_mode(d, mode, activationStatus));
}

/* ---------------------------------------------------------------- running processes
 *
 * processes/<uuid> (a GPU's or a MIG device's UUID) holds the processes NVML reports on it, as a JSON list
 * that a test writes (sim.nvml.set_processes, atomically) and every call reads afresh:
 *   [{"pid": 4242, "usedGpuMemory": 1073741824, "smUtil": 35, "memUtil": 10, "mps": false}, ...]
 * pid (required, > 0); usedGpuMemory in bytes (absent: NVML_VALUE_NOT_AVAILABLE); smUtil and memUtil in
 * percent (smUtil absent: the process has no utilization sample); mps true: an MPS client, listed by
 * nvmlDeviceGetMPSComputeRunningProcesses_v3 instead of nvmlDeviceGetComputeRunningProcesses_v3.
 * Without the file (or without a state dir) nothing runs on the device.
 *
 * As on the real driver: a MIG device lists its own processes with its GPU and compute instance ids; a GPU
 * in MIG mode lists those of all its MIG devices (the aggregate); a GPU without MIG lists its own with
 * both ids 0xFFFFFFFF. nvmlDeviceGetProcessUtilization answers NOT_SUPPORTED for a MIG device and a GPU
 * in MIG mode, NOT_FOUND when no process has a sample; each sample is stamped with the time of the call
 * (a running process is sampled all the time) and only samples newer than lastSeenTimeStamp are given. */

#define MAX_PROCS 256
#define PROCS_FILE_MAX (1 << 20)

typedef struct {
    unsigned pid;
    unsigned long long mem; /* ~0ULL: not available */
    int has_util;
    unsigned sm, memu;
    int mps;
    unsigned gi, ci;
} sim_proc;

/* nvmlProcessInfo_v2_t (also what the _v3 calls fill) */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

static int proc_number(const jvalue *item, const char *key, double max, double *out) {
    const jvalue *v = json_get(item, key);
    if (!v) return 0;
    if (v->type != J_NUM || v->num < 0 || v->num > max || v->num != (double)(unsigned long long)v->num) return -1;
    *out = v->num;
    return 1;
}

/* Appends the processes of processes/<uuid> to procs[*n]; -1 (with a line on stderr) for a file that is
 * not such a list. */
static int read_procs(const char *uuid, unsigned gi, unsigned ci, sim_proc *procs, int *n) {
    char path[1200];
    if (state_path(path, sizeof path, "processes", uuid) < 0) return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char *text = malloc(PROCS_FILE_MAX + 1);
    if (!text) {
        close(fd);
        return -1;
    }
    size_t len = 0;
    ssize_t r;
    while (len < PROCS_FILE_MAX && (r = read(fd, text + len, PROCS_FILE_MAX - len)) > 0) len += (size_t)r;
    close(fd);
    text[len] = '\0';
    char err[160] = "";
    jvalue *doc = json_parse(text, err, sizeof err);
    free(text);
    const char *why = NULL;
    if (!doc) why = err;
    else if (doc->type != J_ARR) why = "not a JSON list";
    for (size_t k = 0; !why && k < doc->len; k++) {
        const jvalue *item = &doc->items[k];
        double pid = 0, mem = 0, sm = 0, memu = 0;
        if (item->type != J_OBJ) why = "an entry is not an object";
        else if (proc_number(item, "pid", 4294967295.0, &pid) != 1 || pid < 1) why = "an entry has no pid > 0";
        else if (*n >= MAX_PROCS) why = "more than 256 processes on one GPU";
        else {
            int has_mem = proc_number(item, "usedGpuMemory", 1.8e19, &mem);
            int has_sm = proc_number(item, "smUtil", 100, &sm);
            int has_memu = proc_number(item, "memUtil", 100, &memu);
            const jvalue *mps = json_get(item, "mps");
            if (has_mem < 0 || has_sm < 0 || has_memu < 0) why = "usedGpuMemory, smUtil or memUtil out of range";
            else if (mps && mps->type != J_BOOL) why = "mps is not true or false";
            else {
                sim_proc *p = &procs[(*n)++];
                p->pid = (unsigned)pid;
                p->mem = has_mem ? (unsigned long long)mem : ~0ULL;
                p->has_util = has_sm;
                p->sm = (unsigned)sm;
                p->memu = (unsigned)memu;
                p->mps = mps && mps->num != 0;
                p->gi = gi;
                p->ci = ci;
            }
        }
    }
    if (doc) json_free(doc);
    if (why) {
        fprintf(stderr, "nvml-sim: %s: %s\n", path, why);
        return -1;
    }
    return 0;
}

/* The processes NVML reports on d (its MIG devices' for a GPU in MIG mode); an NVML error or SUCCESS. */
static nvmlReturn_t device_procs(nvmlDevice_t d, sim_proc *procs, int *n) {
    *n = 0;
    if (IS_MIG(d)) return read_procs(MIG(d)->uuid, MIG(d)->gi, MIG(d)->ci, procs, n) ? NVML_ERROR_UNKNOWN
                                                                                     : NVML_SUCCESS;
    if (!mig_on(d->gpu)) return read_procs(GPU(d)->uuid, NO_ID, NO_ID, procs, n) ? NVML_ERROR_UNKNOWN
                                                                                  : NVML_SUCCESS;
    nvmlReturn_t r = NVML_SUCCESS;
    pthread_mutex_lock(&mig_lock);
    sync_gpu(d->gpu);
    sim_gpu *gp = GPU(d);
    for (int a = 0; a < gp->n_mig && !r; a++) {
        sim_mig *m = &gp->mig[gp->order[a]];
        if (read_procs(m->uuid, m->gi, m->ci, procs, n)) r = NVML_ERROR_UNKNOWN;
    }
    pthread_mutex_unlock(&mig_lock);
    return r;
}

static nvmlReturn_t running_procs(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_v2_t *infos, int mps) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    sim_proc *procs = calloc(MAX_PROCS, sizeof *procs);
    if (!procs) return NVML_ERROR_MEMORY;
    int n = 0, kept = 0;
    r = device_procs(d, procs, &n);
    for (int k = 0; !r && k < n; k++)
        if (procs[k].mps == mps) procs[kept++] = procs[k];
    if (!r && (!infos || *count < (unsigned)kept)) {
        *count = (unsigned)kept;
        r = kept ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    } else if (!r) {
        for (int k = 0; k < kept; k++) {
            infos[k].pid = procs[k].pid;
            infos[k].usedGpuMemory = procs[k].mem;
            infos[k].gpuInstanceId = procs[k].gi;
            infos[k].computeInstanceId = procs[k].ci;
        }
        *count = (unsigned)kept;
    }
    free(procs);
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, void *infos) {
    return running_procs(d, count, infos, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *count, void *infos) {
    return nvmlDeviceGetComputeRunningProcesses_v3(d, count, infos);
}

EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, void *infos) {
    return running_procs(d, count, infos, 1);
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *utilization,
                                                    unsigned int *processSamplesCount,
                                                    unsigned long long lastSeenTimeStamp) {
    nvmlReturn_t r = check(d, 1);
    if (r) return r;
    if (!processSamplesCount) return NVML_ERROR_INVALID_ARGUMENT;
    if (IS_MIG(d) || mig_on(d->gpu)) return NVML_ERROR_NOT_SUPPORTED;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned long long now_us = (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000;
    sim_proc *procs = calloc(MAX_PROCS, sizeof *procs);
    if (!procs) return NVML_ERROR_MEMORY;
    int n = 0, kept = 0;
    r = device_procs(d, procs, &n);
    for (int k = 0; !r && k < n; k++)
        if (procs[k].has_util && now_us > lastSeenTimeStamp) procs[kept++] = procs[k];
    if (!r && kept == 0) {
        r = NVML_ERROR_NOT_FOUND;
    } else if (!r && (!utilization || *processSamplesCount < (unsigned)kept)) {
        *processSamplesCount = (unsigned)kept;
        r = NVML_ERROR_INSUFFICIENT_SIZE;
    } else if (!r) {
        for (int k = 0; k < kept; k++) {
            utilization[k].pid = procs[k].pid;
            utilization[k].timeStamp = now_us;
            utilization[k].smUtil = procs[k].sm;
            utilization[k].memUtil = procs[k].memu;
            utilization[k].encUtil = 0;
            utilization[k].decUtil = 0;
        }
        *processSamplesCount = (unsigned)kept;
    }
    free(procs);
    return r;
}
