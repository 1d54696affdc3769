from taskhandler_operator.cli import console_main

console_main()
