// SPDX-License-Identifier: GPL-2.0
// A stand-in for nvidia-uvm.ko: its own character device, and nvidia first.
#include <linux/fs.h>
#include <linux/module.h>

extern int standin_nvidia_loaded;
static const struct file_operations standin_fops = {.owner = THIS_MODULE};
static int major;

static int __init standin_init(void)
{
	major = register_chrdev(0, "nvidia-uvm", &standin_fops);
	return major < 0 ? major : (standin_nvidia_loaded ? 0 : -ENODEV);
}

static void __exit standin_exit(void)
{
	unregister_chrdev(major, "nvidia-uvm");
}

module_init(standin_init);
module_exit(standin_exit);
MODULE_LICENSE("GPL");
MODULE_VERSION(STANDIN_VERSION);
