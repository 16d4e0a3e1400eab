/*
 * A fake SPANK host for tests/process/test_spank_build.py and
 * tests/bench/bench_spank_host.py: provides the spank_*
 * and slurm_* symbols slurmstepd/srun/sbatch would (exported with -rdynamic),
 * dlopen()s gsrun_spank.so RTLD_LOCAL like Slurm's plugin loader, and drives
 * the callbacks of one context. Every call Slurm would see is printed on
 * stdout, one per line, for the test to check.
 *
 * usage: spank_harness SO CONTEXT [plugstack args...]
 *   CONTEXT: allocator | local | remote | job_script | slurmd
 *   FAKE_OPTS="gs-mps=50;gs-tune=x=1"  options as the user gave them
 *   FAKE_MAJOR / FAKE_MINOR             running Slurm version (default: the one of the
 *                                       headers this harness is compiled with, e.g. 24/11)
 *   FAKE_STEPID                         S_JOB_STEPID (default 0, a normal step)
 *   FAKE_NTASKS                         S_JOB_LOCAL_TASK_COUNT (default 2, the tasks forked)
 *   FAKE_GETOPT="gs-mps=50"             what spank_option_getopt answers (an option
 *                                       Slurm forwarded to slurmstepd); else not given
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <slurm/spank.h>
#include <slurm/slurm_version.h>

struct spank_handle { int unused; };
static struct spank_handle handle;
static spank_context_t ctx;
static struct spank_option *reg[64];
static int nreg;
static int task_id = -1; /* S_TASK_ID: the local rank of the forked task, -1 outside a task */
static char built_major[8], built_minor[8]; /* the Slurm of the headers: "24", "05" */

spank_context_t spank_context(void) { return ctx; }
int spank_remote(spank_t s) { (void)s; return ctx == S_CTX_REMOTE; }
int spank_symbol_supported(const char *s) { (void)s; return 1; }
const char *spank_strerror(spank_err_t e) { return e == ESPANK_NOT_LOCAL ? "Not in local context" : "fake spank error"; }

spank_err_t spank_option_register(spank_t s, struct spank_option *o)
{
	(void)s;
	printf("REGISTER %s has_arg=%d arginfo=%s\n", o->name, o->has_arg, o->arginfo ? o->arginfo : "-");
	reg[nreg++] = o;
	return ESPANK_SUCCESS;
}

spank_err_t spank_option_getopt(spank_t s, struct spank_option *o, char **optarg)
{
	static char val[256];
	const char *spec = getenv("FAKE_GETOPT");
	size_t n = strlen(o->name);
	(void)s;
	if (spec && strncmp(spec, o->name, n) == 0 && (spec[n] == '=' || spec[n] == '\0')) {
		snprintf(val, sizeof(val), "%s", spec[n] == '=' ? spec + n + 1 : "");
		if (optarg)
			*optarg = val;
		printf("GETOPT %s\n", o->name);
		return ESPANK_SUCCESS;
	}
	return ESPANK_ERROR;
}

spank_err_t spank_get_item(spank_t s, spank_item_t item, ...)
{
	static char *env[] = { "SLURM_STEP_TASKS_PER_NODE=2", "HOME=/home/u", NULL };
	va_list ap;
	(void)s;
	va_start(ap, item);
	spank_err_t rc = ESPANK_SUCCESS;
	switch (item) {
	case S_SLURM_VERSION_MAJOR: *va_arg(ap, char **) = getenv("FAKE_MAJOR") ? getenv("FAKE_MAJOR") : built_major; break;
	case S_SLURM_VERSION_MINOR: *va_arg(ap, char **) = getenv("FAKE_MINOR") ? getenv("FAKE_MINOR") : built_minor; break;
	case S_SLURM_VERSION: *va_arg(ap, char **) = "fake-version"; break;
	case S_JOB_ID: *va_arg(ap, uint32_t *) = 4242; break;
	case S_JOB_STEPID: *va_arg(ap, uint32_t *) = getenv("FAKE_STEPID") ? (uint32_t)strtoul(getenv("FAKE_STEPID"), NULL, 0) : 0; break;
	case S_JOB_LOCAL_TASK_COUNT:
		*va_arg(ap, uint32_t *) = getenv("FAKE_NTASKS") ? (uint32_t)strtoul(getenv("FAKE_NTASKS"), NULL, 0) : 2;
		break;
	case S_JOB_UID: *va_arg(ap, uid_t *) = 1000; break;
	case S_JOB_NCPUS: *va_arg(ap, uint16_t *) = 16; break;
	case S_TASK_ID:
		if (task_id < 0)
			rc = ESPANK_NOT_TASK;
		else
			*va_arg(ap, int *) = task_id;
		break;
	case S_TASK_PID: *va_arg(ap, pid_t *) = getpid(); break;
	case S_JOB_ENV: *va_arg(ap, char ***) = env; break;
	case S_JOB_SUPPLEMENTARY_GIDS: {
		static gid_t gids[] = { 27, 100 };
		*va_arg(ap, gid_t **) = gids;
		*va_arg(ap, int *) = 2;
		break;
	}
	default: rc = ESPANK_NOT_AVAIL;
	}
	va_end(ap);
	return rc;
}

spank_err_t spank_getenv(spank_t s, const char *var, char *buf, int len)
{
	(void)s;
	if (strcmp(var, "HOME") != 0)
		return ESPANK_ENV_NOEXIST;
	snprintf(buf, (size_t)len, "/home/u");
	return ESPANK_SUCCESS;
}

spank_err_t spank_setenv(spank_t s, const char *var, const char *val, int overwrite)
{
	(void)s; (void)overwrite;
	printf("SETENV %s=%s\n", var, val);
	return ESPANK_SUCCESS;
}

spank_err_t spank_unsetenv(spank_t s, const char *var)
{
	(void)s;
	printf("UNSETENV %s\n", var);
	return ESPANK_SUCCESS;
}

spank_err_t spank_job_control_setenv(spank_t s, const char *name, const char *value, int overwrite)
{
	(void)s; (void)overwrite;
	if (ctx != S_CTX_ALLOCATOR && ctx != S_CTX_LOCAL)
		return ESPANK_NOT_LOCAL;
	printf("JOBCONTROL SPANK_%s=%s\n", name, value);
	return ESPANK_SUCCESS;
}

spank_err_t spank_job_control_getenv(spank_t s, const char *n, char *b, int l) { (void)s; (void)n; (void)b; (void)l; return ESPANK_ENV_NOEXIST; }
spank_err_t spank_job_control_unsetenv(spank_t s, const char *n) { (void)s; (void)n; return ESPANK_SUCCESS; }

/*
 * The interpreter's start, interposed: the Python half of the plugin is linked to libpython, which
 * the plugin dlopen()s RTLD_GLOBAL, and symbols resolve to this executable's (-rdynamic) first.
 * The plugin asks Py_IsInitialized() before it starts Python. slurmstepd (remote, job_script) and
 * slurmd must never start it: there the host dies here (PY_INIT ..., then SIGABRT); elsewhere the
 * call goes on to libpython's own.
 */
int Py_IsInitialized(void)
{
	if (ctx != S_CTX_ALLOCATOR && ctx != S_CTX_LOCAL) {
		printf("PY_INIT in context %d (pid %d, task %d)\n", (int)ctx, (int)getpid(), task_id);
		abort();
	}
	int (*real)(void) = (int (*)(void))dlsym(RTLD_NEXT, "Py_IsInitialized");
	return real ? real() : 0;
}

#define LOGFN(fn, tag) \
	void fn(const char *fmt, ...) \
	{ \
		va_list ap; \
		va_start(ap, fmt); \
		fputs(tag, stdout); \
		vprintf(fmt, ap); \
		fputc('\n', stdout); \
		va_end(ap); \
	}
LOGFN(slurm_info, "INFO: ")
LOGFN(slurm_error, "ERROR: ")
LOGFN(slurm_verbose, "VERBOSE: ")
LOGFN(slurm_debug, "DEBUG: ")
LOGFN(slurm_debug2, "DEBUG2: ")
LOGFN(slurm_debug3, "DEBUG3: ")
LOGFN(slurm_spank_log, "LOG: ")

static int call(void *so, const char *name, int ac, char **av)
{
	spank_f *f = (spank_f *)dlsym(so, name);
	if (f == NULL) {
		printf("MISSING %s\n", name);
		return 0;
	}
	int rc = f(&handle, ac, av);
	printf("RC %s %d\n", name, rc);
	return rc;
}

static void give_options(int remote)
{
	const char *spec = getenv("FAKE_OPTS");
	if (!spec || !*spec)
		return;
	char *copy = strdup(spec), *save = NULL;
	for (char *tok = strtok_r(copy, ";", &save); tok; tok = strtok_r(NULL, ";", &save)) {
		char *eq = strchr(tok, '=');
		const char *val = NULL;
		if (eq) {
			*eq = '\0';
			val = eq + 1;
		}
		for (int i = 0; i < nreg; i++)
			if (strcmp(reg[i]->name, tok) == 0 && reg[i]->cb)
				printf("OPTCB %s %d\n", tok, reg[i]->cb(reg[i]->val, val, remote));
	}
	free(copy);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	snprintf(built_major, sizeof(built_major), "%d", SLURM_VERSION_MAJOR(SLURM_VERSION_NUMBER));
	snprintf(built_minor, sizeof(built_minor), "%02d", SLURM_VERSION_MINOR(SLURM_VERSION_NUMBER));
	if (argc < 3) {
		fprintf(stderr, "usage: %s SO CONTEXT [args...]\n", argv[0]);
		return 2;
	}
	const char *c = argv[2];
	ctx = !strcmp(c, "allocator") ? S_CTX_ALLOCATOR : !strcmp(c, "local") ? S_CTX_LOCAL
	    : !strcmp(c, "remote") ? S_CTX_REMOTE : !strcmp(c, "job_script") ? S_CTX_JOB_SCRIPT
	    : !strcmp(c, "slurmd") ? S_CTX_SLURMD : S_CTX_ERROR;
	void *so = dlopen(argv[1], RTLD_LAZY | RTLD_LOCAL);
	if (so == NULL) {
		printf("DLOPEN FAILED %s\n", dlerror());
		return 3;
	}
	const char *type = dlsym(so, "plugin_type");
	const char *name = dlsym(so, "plugin_name");
	const unsigned *ver = dlsym(so, "plugin_version");
	printf("PLUGIN %s %s 0x%x\n", type ? type : "?", name ? name : "?", ver ? *ver : 0);
	int ac = argc - 3;
	char **av = argv + 3;
	if (call(so, "slurm_spank_init", ac, av) != 0)
		return 10;
	give_options(ctx == S_CTX_REMOTE);
	if (call(so, "slurm_spank_init_post_opt", ac, av) != 0)
		return 11;
	if (ctx == S_CTX_LOCAL)
		call(so, "slurm_spank_local_user_init", ac, av);
	if (ctx == S_CTX_REMOTE) {
		call(so, "slurm_spank_user_init", ac, av);
		for (int t = 0; t < 2; t++) {
			pid_t pid = fork();
			if (pid == 0) { /* the task, as slurmstepd forks it: local rank t */
				task_id = t;
				int rc = call(so, "slurm_spank_task_init", ac, av);
				cpu_set_t set;
				CPU_ZERO(&set);
				sched_getaffinity(0, sizeof(set), &set);
				printf("TASK %d pid-ok cpus=%d\n", t, CPU_COUNT(&set));
				_exit(rc == 0 ? 0 : 1);
			}
			int st = 0;
			waitpid(pid, &st, 0);
			printf("CHILD %d exit=%d signaled=%d\n", t, WIFEXITED(st) ? WEXITSTATUS(st) : -1,
			       WIFSIGNALED(st) ? WTERMSIG(st) : 0);
			task_id = t; /* task_exit: in slurmstepd, for that task */
			call(so, "slurm_spank_task_exit", ac, av);
			task_id = -1;
		}
	}
	if (ctx == S_CTX_JOB_SCRIPT)
		call(so, "slurm_spank_job_prolog", ac, av);
	call(so, "slurm_spank_exit", ac, av);
	/* is libpython in this process? (a job without --gs-* options, and slurmstepd, must not pay
	 * for mapping it) and the plugin's Python half? */
	FILE *maps = fopen("/proc/self/maps", "r");
	char line[4096];
	int mapped = 0, py_part = 0;
	while (maps && fgets(line, sizeof(line), maps)) {
		mapped |= strstr(line, "libpython") != NULL;
		py_part |= strstr(line, "gsrun_spank_py.so") != NULL;
	}
	if (maps)
		fclose(maps);
	printf("LIBPYTHON mapped=%d\n", mapped);
	printf("PYPART mapped=%d\n", py_part);
	printf("DONE\n");
	return 0;
}
