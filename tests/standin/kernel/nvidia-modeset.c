// SPDX-License-Identifier: GPL-2.0
// A stand-in for nvidia-modeset.ko: nothing of its own, and nvidia first.
#include <linux/module.h>

extern int standin_nvidia_loaded;

static int __init standin_init(void)
{
	return standin_nvidia_loaded ? 0 : -ENODEV;
}

static void __exit standin_exit(void)
{
}

module_init(standin_init);
module_exit(standin_exit);
MODULE_LICENSE("GPL");
MODULE_VERSION(STANDIN_VERSION);
