// SPDX-License-Identifier: GPL-2.0
// A stand-in for nvidia.ko in the boot tests: it takes the parameters an
// operator sets (NVreg_*), registers the character device the driver does
// (major 195), names the GSP firmware as the driver does, and "binds" the
// GPUs it is told of (standin_gpus=BDF+BDF) after standin_delay_ms, by making
// their /proc/driver/nvidia/gpus/BDF folders, as the driver's probe does.
// standin_nvswitches=BDF+BDF makes /proc/driver/nvidia-nvswitch/devices/BDF.
#include <linux/fs.h>
#include <linux/module.h>
#include <linux/proc_fs.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/workqueue.h>

static int NVreg_EnableGpuFirmware = 18;
module_param(NVreg_EnableGpuFirmware, int, 0444);
static int NVreg_OpenRmEnableUnsupportedGpus;
module_param(NVreg_OpenRmEnableUnsupportedGpus, int, 0444);
static char *standin_gpus = "";
module_param(standin_gpus, charp, 0444);
static char *standin_nvswitches = "";
module_param(standin_nvswitches, charp, 0444);
static int standin_delay_ms;
module_param(standin_delay_ms, int, 0444);

int standin_nvidia_loaded = 1;  // what the other stand-ins link against, so they depend on this one
EXPORT_SYMBOL(standin_nvidia_loaded);

static const struct file_operations standin_fops = {.owner = THIS_MODULE};
static struct proc_dir_entry *driver_dir, *gpus_dir, *nvswitch_dir;
static struct delayed_work bind_work;

static void make_folders(struct proc_dir_entry *parent, const char *list)
{
	char *copy = kstrdup(list, GFP_KERNEL), *cursor = copy, *name;

	while (copy && (name = strsep(&cursor, "+")) != NULL)
		if (*name)
			proc_mkdir(name, parent);
	kfree(copy);
}

static void bind_gpus(struct work_struct *work)
{
	make_folders(gpus_dir, standin_gpus);
}

static int __init standin_init(void)
{
	int rc = register_chrdev(195, "nvidia-frontend", &standin_fops);

	if (rc < 0)
		return rc;
	driver_dir = proc_mkdir("driver/nvidia", NULL);
	gpus_dir = proc_mkdir("gpus", driver_dir);
	if (*standin_nvswitches) {
		nvswitch_dir = proc_mkdir("driver/nvidia-nvswitch", NULL);
		make_folders(proc_mkdir("devices", nvswitch_dir), standin_nvswitches);
	}
	INIT_DELAYED_WORK(&bind_work, bind_gpus);
	schedule_delayed_work(&bind_work, msecs_to_jiffies(standin_delay_ms));
	return 0;
}

static void __exit standin_exit(void)
{
	cancel_delayed_work_sync(&bind_work);
	proc_remove(nvswitch_dir);
	proc_remove(driver_dir);
	unregister_chrdev(195, "nvidia-frontend");
}

module_init(standin_init);
module_exit(standin_exit);
MODULE_LICENSE("GPL");
MODULE_VERSION(STANDIN_VERSION);
MODULE_FIRMWARE("nvidia/" STANDIN_VERSION "/gsp_ga10x.bin");
MODULE_FIRMWARE("nvidia/" STANDIN_VERSION "/gsp_tu10x.bin");
